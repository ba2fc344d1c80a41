// Command controlplane runs a real, minimal Kubernetes control plane on loopback for
// wasm-provisioner's tests, demo and benchmarks.
//
// One binary, one process per component (hyperkube style): the first argument picks
// what this process is.
//
//	controlplane etcd ...                    upstream etcd 3.6 (etcdmain)
//	controlplane kube-apiserver ...          upstream kube-apiserver
//	controlplane kube-controller-manager ... upstream kube-controller-manager
//	controlplane kube-scheduler ...          upstream kube-scheduler
//	controlplane run   [--dir D]             start all four, wait until ready, block until
//	                                         SIGINT/SIGTERM (or the parent dies), then stop them
//	controlplane start [--dir D]             like run, but detached; prints the kubeconfig path
//	controlplane stop  --dir D               stop what start started, by recorded PID
//
// The components are upstream code pinned by go.sum; only this orchestration is ours.
package main

import (
	"fmt"
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	component, args := os.Args[1], os.Args[2:]
	switch component {
	case "etcd":
		etcdmain.Main(append([]string{"etcd"}, args...))
	case "kube-apiserver":
		cmd := apiserver.NewAPIServerCommand()
		cmd.SetArgs(args)
		os.Exit(cli.Run(cmd))
	case "kube-controller-manager":
		cmd := controllermanager.NewControllerManagerCommand()
		cmd.SetArgs(args)
		os.Exit(cli.Run(cmd))
	case "kube-scheduler":
		cmd := scheduler.NewSchedulerCommand()
		cmd.SetArgs(args)
		os.Exit(cli.Run(cmd))
	case "run", "start", "stop", "restart-apiserver":
		if err := orchestrate(component, args); err != nil {
			fmt.Fprintf(os.Stderr, "controlplane %s: %v\n", component, err)
			os.Exit(1)
		}
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: controlplane {run|start|stop|restart-apiserver} [--dir DIR] | {etcd|kube-apiserver|kube-controller-manager|kube-scheduler} ARGS...")
	os.Exit(2)
}
