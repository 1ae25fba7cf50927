//go:build !kubelet_noctx

package main

import (
	"context"

	"github.com/spf13/cobra"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// newKubeletCommand is the kubelet's command: from Kubernetes 1.32 on it takes a context.
func newKubeletCommand() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) }
