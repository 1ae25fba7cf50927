// Command kube is the dev cluster's multi-call binary: kube-apiserver, kube-controller-manager,
// kube-scheduler, kubelet, kube-proxy, kubectl and etcd, built from their released Go modules
// (k8s.io/kubernetes and go.etcd.io/etcd/server/v3 at the versions go.mod pins) so that the
// tests run against the real components. It runs the component named by the base name of
// argv[0] (scripts/dev-cluster-build makes one symlink a name), or by its first argument
// ("kube kubelet --version").
//
// The version each component reports comes from -ldflags -X at build time
// (scripts/dev-cluster-build): without it they say v0.0.0-master.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	kubectl "k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var commands = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kubelet":                 newKubeletCommand,
	"kube-proxy":              func() *cobra.Command { return proxy.NewProxyCommand() },
	"kubectl":                 func() *cobra.Command { return kubectl.NewDefaultKubectlCommand() },
}

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args
	if name == "kube" && len(args) > 1 {
		name, args = args[1], args[1:]
	}
	if name == "etcd" {
		etcdmain.Main(args)
		return
	}
	make, ok := commands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "kube: unknown component %q (one of etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl)\n", name)
		os.Exit(2)
	}
	cmd := make()
	cmd.SetArgs(args[1:])
	os.Exit(cli.Run(cmd))
}
