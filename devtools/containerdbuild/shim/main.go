// Command containerd-shim-runc-v2 is containerd 2's runc shim, built from
// github.com/containerd/containerd/v2 at the version the module's go.mod pins. A binary of its
// own: the shim starts its daemon by running its own executable again (/proc/self/exe), so it
// cannot be one name of a multi-call binary.
package main

import (
	"context"

	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/manager"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task/plugin"
	"github.com/containerd/containerd/v2/pkg/shim"
)

func main() {
	shim.RunShim(context.Background(), manager.NewShimManager("io.containerd.runc.v2"))
}
