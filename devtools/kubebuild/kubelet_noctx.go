//go:build kubelet_noctx

package main

import (
	"github.com/spf13/cobra"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// newKubeletCommand is the kubelet's command before Kubernetes 1.32 (no context argument).
func newKubeletCommand() *cobra.Command { return kubelet.NewKubeletCommand() }
