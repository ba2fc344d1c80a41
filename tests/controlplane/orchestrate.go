package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// adminToken is the bearer token of the admin user (group system:masters). The control
// plane only listens on loopback and lives for one test run.
const adminToken = "wasm-provisioner-admin-token"

// readyTimeout bounds the wait for all components; startup can exceed 30 s under load.
const readyTimeout = 180 * time.Second

// stopGrace is how long a component gets to exit after SIGTERM before SIGKILL.
const stopGrace = 10 * time.Second

// Files inside the control plane's directory.
const (
	kubeconfigFile = "kubeconfig"
	readyFile      = "ready"
	launcherPIDs   = "launcher.pid"
	componentPIDs  = "components.pid"
	launcherLog    = "launcher.log"
	// apiserverRestarts counts the kube-apiserver restarts done on request.
	apiserverRestarts = "apiserver-restarts"
)

func orchestrate(command string, args []string) error {
	flags := flag.NewFlagSet(command, flag.ContinueOnError)
	dir := flags.String("dir", "", "directory for data, certificates, logs and the kubeconfig (default: a new temp dir)")
	detached := flags.Bool("detached", false, "run: keep running when the starting process exits (used by start)")
	if err := flags.Parse(args); err != nil {
		return err
	}
	switch command {
	case "run":
		return run(*dir, *detached)
	case "start":
		return start(*dir)
	case "stop":
		if *dir == "" {
			return errors.New("stop needs --dir: the directory start printed")
		}
		return stop(*dir)
	case "restart-apiserver":
		if *dir == "" {
			return errors.New("restart-apiserver needs --dir: the directory start printed")
		}
		return restartAPIServer(*dir)
	}
	return fmt.Errorf("unknown command %q", command)
}

// start runs `run` detached from this process and returns once the control plane is ready.
func start(dir string) error {
	dir, err := prepareDir(dir)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logFile, err := os.Create(filepath.Join(dir, launcherLog))
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(self, "run", "--dir", dir, "--detached")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	deadline := time.Now().Add(readyTimeout + 10*time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(filepath.Join(dir, readyFile)); err == nil {
			fmt.Printf("kubeconfig: %s\n", filepath.Join(dir, kubeconfigFile))
			return nil
		}
		if err := syscall.Kill(cmd.Process.Pid, 0); err != nil {
			return fmt.Errorf("control plane exited before it was ready; see %s", filepath.Join(dir, launcherLog))
		}
		time.Sleep(200 * time.Millisecond)
	}
	_ = stop(dir)
	return fmt.Errorf("control plane not ready after %s; see %s", readyTimeout, filepath.Join(dir, launcherLog))
}

// run starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler, waits until all are
// ready, writes the kubeconfig, then blocks until SIGINT/SIGTERM or until the process
// that started it dies. Everything started is stopped on the way out.
func run(dir string, detached bool) error {
	ownDir := dir == ""
	dir, err := prepareDir(dir)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, launcherPIDs), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return err
	}
	parent := os.Getppid()

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	restarts := make(chan os.Signal, 1)
	signal.Notify(restarts, syscall.SIGUSR1)
	restarted := 0
	// Whoever started us may be gone with the read end of our stdout: a write must not
	// kill us (Go exits on SIGPIPE to stdout) before we have stopped the components.
	signal.Ignore(syscall.SIGPIPE)

	plane := &controlPlane{dir: dir}
	defer func() {
		plane.stopAll()
		if ownDir {
			os.RemoveAll(dir)
		}
	}()
	if err := plane.startAll(); err != nil {
		return err
	}
	fmt.Printf("kubeconfig: %s\n", filepath.Join(dir, kubeconfigFile))
	fmt.Printf("export KUBECONFIG=%s\n", filepath.Join(dir, kubeconfigFile))
	if err := os.WriteFile(filepath.Join(dir, readyFile), nil, 0o600); err != nil {
		return err
	}

	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case sig := <-signals:
			fmt.Printf("received %s, stopping the control plane\n", sig)
			return nil
		case <-restarts:
			if err := plane.restart("kube-apiserver"); err != nil {
				return err
			}
			restarted++
			if err := os.WriteFile(filepath.Join(dir, apiserverRestarts), []byte(strconv.Itoa(restarted)), 0o600); err != nil {
				return err
			}
		case <-tick.C:
			if !detached && os.Getppid() != parent {
				fmt.Println("the process that started the control plane is gone, stopping")
				return nil
			}
			if name, exited := plane.firstExited(); exited {
				return fmt.Errorf("%s exited unexpectedly; see its log in %s", name, dir)
			}
		}
	}
}

// restartAPIServer asks the running launcher (SIGUSR1) to stop kube-apiserver and start
// it again on the same port over the same etcd, and returns once it is ready again: an
// API server restart as a rolling control-plane upgrade does it, for the chaos tests.
func restartAPIServer(dir string) error {
	pid, err := readPID(filepath.Join(dir, launcherPIDs))
	if err != nil {
		return fmt.Errorf("no running control plane in %s: %w", dir, err)
	}
	count := func() int {
		data, _ := os.ReadFile(filepath.Join(dir, apiserverRestarts))
		n, _ := strconv.Atoi(strings.TrimSpace(string(data)))
		return n
	}
	before := count()
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		return fmt.Errorf("signalling the launcher: %w", err)
	}
	deadline := time.Now().Add(readyTimeout)
	for time.Now().Before(deadline) {
		if count() > before {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver not back after %s; see %s", readyTimeout, filepath.Join(dir, launcherLog))
}

// stop ends a control plane started with `start`: the launcher first (it stops its
// components), then any component PID left over.
func stop(dir string) error {
	if pid, err := readPID(filepath.Join(dir, launcherPIDs)); err == nil {
		terminate(pid)
	}
	if data, err := os.ReadFile(filepath.Join(dir, componentPIDs)); err == nil {
		for _, field := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(field); err == nil {
				terminate(pid)
			}
		}
	}
	return os.RemoveAll(dir)
}

func prepareDir(dir string) (string, error) {
	if dir == "" {
		return os.MkdirTemp("", "wasm-provisioner-controlplane-")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	return abs, os.MkdirAll(abs, 0o700)
}

func readPID(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(data)))
}

// terminate sends SIGTERM, waits up to stopGrace for the process to go, then SIGKILLs it.
func terminate(pid int) {
	if pid <= 0 || syscall.Kill(pid, syscall.SIGTERM) != nil {
		return
	}
	deadline := time.Now().Add(stopGrace)
	for time.Now().Before(deadline) {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// component is one running upstream process.
type component struct {
	name string
	args []string
	cmd  *exec.Cmd
	done chan struct{}
}

type controlPlane struct {
	dir        string
	components []*component
	apiURL     string
}

func (p *controlPlane) startAll() error {
	pki, err := writePKI(p.dir)
	if err != nil {
		return fmt.Errorf("writing certificates: %w", err)
	}
	ports, err := freePorts(5)
	if err != nil {
		return err
	}
	etcdClient, etcdPeer, apiPort, kcmPort, schedulerPort := ports[0], ports[1], ports[2], ports[3], ports[4]
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	apiURL := fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	p.apiURL = apiURL

	kubeconfig := filepath.Join(p.dir, kubeconfigFile)
	if err := writeKubeconfig(kubeconfig, apiURL, pki.caPEM); err != nil {
		return err
	}

	if err := p.launch("etcd",
		"--name=default",
		"--data-dir="+filepath.Join(p.dir, "etcd"),
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL,
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	); err != nil {
		return err
	}
	if err := waitHTTP("etcd", etcdURL+"/health", "", p); err != nil {
		return err
	}

	if err := p.launch("kube-apiserver",
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(apiPort),
		"--tls-cert-file="+pki.servingCert,
		"--tls-private-key-file="+pki.servingKey,
		"--client-ca-file="+pki.caCert,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+pki.serviceAccountKey,
		"--service-account-signing-key-file="+pki.serviceAccountKey,
		"--token-auth-file="+pki.tokenFile,
		"--authorization-mode=RBAC",
		"--enable-priority-and-fairness=false",
		"--allow-privileged=true",
		"--v=0",
	); err != nil {
		return err
	}
	if err := waitHTTP("kube-apiserver", apiURL+"/readyz", adminToken, p); err != nil {
		return err
	}

	if err := p.launch("kube-controller-manager",
		"--kubeconfig="+kubeconfig,
		"--authentication-kubeconfig="+kubeconfig,
		"--authorization-kubeconfig="+kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(kcmPort),
		"--cert-dir="+filepath.Join(p.dir, "kcm-certs"),
		"--controllers=persistentvolume-binder-controller,persistentvolumeclaim-protection-controller,persistentvolume-protection-controller,persistentvolume-expander-controller,namespace-controller,garbage-collector-controller",
		"--leader-elect=false",
		"--use-service-account-credentials=false",
		"--pvclaimbinder-sync-period=2s",
		// No client-side throttle of the binder: the load benchmark measures the machine.
		"--kube-api-qps=5000",
		"--kube-api-burst=10000",
		"--v=0",
	); err != nil {
		return err
	}
	if err := waitHTTP("kube-controller-manager", fmt.Sprintf("https://127.0.0.1:%d/healthz", kcmPort), "", p); err != nil {
		return err
	}

	// The scheduler sets a WaitForFirstConsumer claim's selected node when a pod using
	// it is scheduled (pods never run: there is no kubelet).
	if err := p.launch("kube-scheduler",
		"--kubeconfig="+kubeconfig,
		"--authentication-kubeconfig="+kubeconfig,
		"--authorization-kubeconfig="+kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(schedulerPort),
		"--leader-elect=false",
		"--kube-api-qps=5000",
		"--kube-api-burst=10000",
		"--v=0",
	); err != nil {
		return err
	}
	return waitHTTP("kube-scheduler", fmt.Sprintf("https://127.0.0.1:%d/healthz", schedulerPort), "", p)
}

// launch starts one component as a child process of this binary, logging to a file.
func (p *controlPlane) launch(name string, args ...string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logFile, err := os.Create(filepath.Join(p.dir, name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(self, append([]string{name}, args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = p.dir
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("starting %s: %w", name, err)
	}
	c := &component{name: name, args: args, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(c.done)
	}()
	p.components = append(p.components, c)
	return p.recordPIDs()
}

// restart stops one component (SIGTERM, then SIGKILL after stopGrace) and starts it
// again with the same arguments; for kube-apiserver it waits until /readyz answers.
func (p *controlPlane) restart(name string) error {
	for i, c := range p.components {
		if c.name != name {
			continue
		}
		stopComponent(c)
		fmt.Printf("restarting %s\n", name)
		p.components = append(p.components[:i], p.components[i+1:]...)
		if err := p.launch(name, c.args...); err != nil {
			return err
		}
		if name == "kube-apiserver" {
			return waitHTTP(name, p.apiURL+"/readyz", adminToken, p)
		}
		return nil
	}
	return fmt.Errorf("no component %q to restart", name)
}

func (p *controlPlane) recordPIDs() error {
	var pids []string
	for _, c := range p.components {
		pids = append(pids, strconv.Itoa(c.cmd.Process.Pid))
	}
	return os.WriteFile(filepath.Join(p.dir, componentPIDs), []byte(strings.Join(pids, "\n")+"\n"), 0o600)
}

func (p *controlPlane) firstExited() (string, bool) {
	for _, c := range p.components {
		select {
		case <-c.done:
			return c.name, true
		default:
		}
	}
	return "", false
}

// stopAll stops components in reverse start order: SIGTERM, then SIGKILL after stopGrace.
func (p *controlPlane) stopAll() {
	for i := len(p.components) - 1; i >= 0; i-- {
		stopComponent(p.components[i])
	}
	_ = os.Remove(filepath.Join(p.dir, componentPIDs))
}

// stopComponent stops one component: SIGTERM, then SIGKILL after stopGrace; it returns
// once the process has exited.
func stopComponent(c *component) {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(stopGrace):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// waitHTTP polls url until it answers 200, a component dies, or readyTimeout passes.
func waitHTTP(name, url, token string, p *controlPlane) error {
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, // readiness probe on loopback only
	}
	deadline := time.Now().Add(readyTimeout)
	for time.Now().Before(deadline) {
		if exited, ok := p.firstExited(); ok {
			return fmt.Errorf("%s exited while waiting for %s; see %s", exited, name, filepath.Join(p.dir, exited+".log"))
		}
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %s; see %s", name, readyTimeout, filepath.Join(p.dir, name+".log"))
}

// freePorts returns n distinct free loopback TCP ports.
func freePorts(n int) ([]int, error) {
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free loopback port: %w", err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
