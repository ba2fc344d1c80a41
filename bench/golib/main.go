// The Go library side of the load benchmark (see docs/benchmarks.md, "Load benchmark"): a
// hostpath provisioner built on sigs.k8s.io/sig-storage-lib-external-provisioner, run
// as the benchmark runs the host, so the two are measured side by side on the same
// control plane. Provision makes the directory `<dir>/<pv name>` and returns a PV with a
// hostPath source to it; Delete removes it. Every API request is counted by verb,
// resource and status code and served at /metrics as the host's
// `wasm_provisioner_kube_api_requests_total`, so the benchmark reads both alike.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"
)

// hostPath provisions a directory per volume under dir.
type hostPath struct{ dir string }

func (p *hostPath) Provision(_ context.Context, options controller.ProvisionOptions) (*v1.PersistentVolume, controller.ProvisioningState, error) {
	path := filepath.Join(p.dir, options.PVName)
	if err := os.MkdirAll(path, 0o777); err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	policy := v1.PersistentVolumeReclaimDelete
	if options.StorageClass.ReclaimPolicy != nil {
		policy = *options.StorageClass.ReclaimPolicy
	}
	// The library sets the claimRef, the class and the provisioned-by annotation.
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: options.PVName},
		Spec: v1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: policy,
			AccessModes:                   options.PVC.Spec.AccessModes,
			MountOptions:                  options.StorageClass.MountOptions,
			Capacity: v1.ResourceList{
				v1.ResourceStorage: options.PVC.Spec.Resources.Requests[v1.ResourceStorage],
			},
			PersistentVolumeSource: v1.PersistentVolumeSource{
				HostPath: &v1.HostPathVolumeSource{Path: path},
			},
		},
	}, controller.ProvisioningFinished, nil
}

func (p *hostPath) Delete(_ context.Context, volume *v1.PersistentVolume) error {
	if volume.Spec.HostPath == nil {
		return fmt.Errorf("volume %s has no hostPath", volume.Name)
	}
	return os.RemoveAll(volume.Spec.HostPath.Path)
}

// counts holds requests by verb, resource and status code, as the host's counter.
type counts struct {
	sync.Mutex
	byKey map[[3]string]uint64
}

func (c *counts) add(verb, resource, code string) {
	c.Lock()
	c.byKey[[3]string{verb, resource, code}]++
	c.Unlock()
}

// render writes the counter in the Prometheus text format, sorted.
func (c *counts) render() string {
	c.Lock()
	defer c.Unlock()
	lines := make([]string, 0, len(c.byKey))
	for k, n := range c.byKey {
		lines = append(lines, fmt.Sprintf("wasm_provisioner_kube_api_requests_total{code=%q,resource=%q,verb=%q} %d", k[2], k[1], k[0], n))
	}
	sort.Strings(lines)
	return "# HELP wasm_provisioner_kube_api_requests_total Kubernetes API requests sent by the Go library provisioner, by verb, resource and status code\n" +
		"# TYPE wasm_provisioner_kube_api_requests_total counter\n" + strings.Join(lines, "\n") + "\n"
}

// counting is the RoundTripper that counts every request (a watch once, when it opens;
// `error` when no response came).
type counting struct {
	next   http.RoundTripper
	counts *counts
}

func (t counting) RoundTrip(request *http.Request) (*http.Response, error) {
	verb, resource := verbAndResource(request.Method, request.URL.Path, request.URL.Query().Get("watch"))
	response, err := t.next.RoundTrip(request)
	code := "error"
	if err == nil {
		code = fmt.Sprint(response.StatusCode)
	}
	t.counts.add(verb, resource, code)
	return response, err
}

// verbAndResource is the host's verb_and_resource (host/src/client.rs): the API
// server's verb and resource (`resource` or `resource/subresource`) of a request;
// ("", path) for a path that is not a resource (`/version`, discovery).
func verbAndResource(method, path, watch string) (string, string) {
	segments := strings.FieldsFunc(path, func(r rune) bool { return r == '/' })
	var rest []string
	switch {
	case len(segments) >= 2 && segments[0] == "api":
		rest = segments[2:]
	case len(segments) >= 3 && segments[0] == "apis":
		rest = segments[3:]
	default:
		return "", path
	}
	// a namespaced resource, or the namespace object itself and its subresources
	if len(rest) >= 3 && rest[0] == "namespaces" {
		rest = rest[2:]
	}
	if len(rest) == 0 {
		return "", path
	}
	resource, named := rest[0], len(rest) >= 2
	if len(rest) >= 3 {
		resource += "/" + rest[2]
	}
	switch {
	case method == http.MethodGet && (watch == "true" || watch == "1"):
		return "watch", resource
	case method == http.MethodGet && named:
		return "get", resource
	case method == http.MethodGet:
		return "list", resource
	case method == http.MethodPost:
		return "create", resource
	case method == http.MethodPut:
		return "update", resource
	case method == http.MethodPatch:
		return "patch", resource
	case method == http.MethodDelete && named:
		return "delete", resource
	case method == http.MethodDelete:
		return "deletecollection", resource
	}
	return "other", resource
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster")
	name := flag.String("provisioner", "", "provisioner name (the StorageClass's provisioner)")
	dir := flag.String("dir", "", "directory the volumes are made in")
	qps := flag.Float64("kube-api-qps", 5, "client QPS (client-go's default 5); 0 or negative: no limit")
	burst := flag.Int("kube-api-burst", 10, "client burst (client-go's default 10)")
	threads := flag.Int("threads", controller.DefaultThreadiness, "workers of each queue (the library's Threadiness)")
	addFinalizer := flag.Bool("add-finalizer", false, "the library's AddFinalizer: its PVs carry external-provisioner.volume.kubernetes.io/finalizer, as the host's do by default (the library's default: off)")
	metricsAddress := flag.String("metrics-address", "127.0.0.1:0", "address of /metrics and /readyz")
	klog.InitFlags(nil)
	flag.Parse()
	if *name == "" || *dir == "" {
		klog.Fatal("--provisioner and --dir are required")
	}

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatalf("kubeconfig: %v", err)
	}
	// client-go's rest.Config: QPS -1 disables its token bucket.
	config.QPS, config.Burst = float32(*qps), *burst
	if *qps <= 0 {
		config.QPS = -1
	}
	requests := &counts{byKey: map[[3]string]uint64{}}
	config.WrapTransport = func(next http.RoundTripper) http.RoundTripper {
		return counting{next: next, counts: requests}
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		klog.Fatalf("client: %v", err)
	}

	// The informers the library would make itself (one factory, its resync period),
	// started here so /readyz can say when their caches synced.
	factory := informers.NewSharedInformerFactory(client, controller.DefaultResyncPeriod)
	claims := factory.Core().V1().PersistentVolumeClaims().Informer()
	volumes := factory.Core().V1().PersistentVolumes().Informer()
	classes := factory.Storage().V1().StorageClasses().Informer()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	provision := controller.NewProvisionController(ctx, client, *name, &hostPath{dir: *dir},
		controller.LeaderElection(false),
		controller.Threadiness(*threads),
		controller.AddFinalizer(*addFinalizer),
		controller.ClaimsInformer(claims),
		controller.VolumesInformer(volumes),
		controller.ClassesInformer(classes),
	)

	var ready atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, requests.render())
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "caches not synced", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	listener, err := net.Listen("tcp", *metricsAddress)
	if err != nil {
		klog.Fatalf("metrics address: %v", err)
	}
	klog.Infof("serving /metrics and /readyz on %s", listener.Addr())
	go func() { _ = http.Serve(listener, mux) }()

	factory.Start(ctx.Done())
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), claims.HasSynced, volumes.HasSynced, classes.HasSynced) {
			ready.Store(true)
		}
	}()
	klog.Infof("provisioner %s: volumes in %s, QPS %v, burst %d, %d threads", *name, *dir, config.QPS, config.Burst, *threads)
	// Returns once SIGTERM (or Ctrl-C) cancelled ctx.
	provision.Run(ctx)
}
