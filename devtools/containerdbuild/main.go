// Command containerd-multi is the dev cluster's containerd 2 and ctr, built from
// github.com/containerd/containerd/v2 at the version go.mod pins. It runs the program named by
// the base name of argv[0] (scripts/dev-cluster-build makes one symlink a name). The runc shim
// is a binary of its own (./shim), found by containerd beside it on PATH.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	_ "github.com/containerd/containerd/v2/cmd/containerd/builtins"
	"github.com/containerd/containerd/v2/cmd/containerd/command"
	ctrapp "github.com/containerd/containerd/v2/cmd/ctr/app"
)

func main() {
	switch name := filepath.Base(os.Args[0]); name {
	case "containerd":
		if err := command.App().Run(context.Background(), os.Args); err != nil {
			fmt.Fprintf(os.Stderr, "containerd: %s\n", err)
			os.Exit(1)
		}
	case "ctr":
		if err := ctrapp.New().Run(context.Background(), os.Args); err != nil {
			fmt.Fprintf(os.Stderr, "ctr: %s\n", err)
			os.Exit(1)
		}
	default:
		fmt.Fprintf(os.Stderr, "containerd-multi: unknown program %q (containerd, ctr)\n", name)
		os.Exit(2)
	}
}
