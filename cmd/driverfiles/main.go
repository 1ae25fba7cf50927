// Command omaticaya-driver-files lists the NVIDIA driver's files under a driver root as the
// NVIDIA container toolkit's own CDI generation finds them, for the DRA plugin of
// gpu.omaticaya.io (omaticaya_py/dra/driverfiles.py), which mounts them into the containers of
// the claims it prepares: no runtime hook, no `nvidia` runtime needed for a container to find
// its driver.
//
// What is listed is the toolkit's (github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi, mode
// nvml, the version go.mod pins), never a copy of its rules: the common edits of its generated
// CDI spec, the ones every GPU of the node shares: the driver's libraries of its version
// (lib*.so.<version>, found through the root's ld.so.cache and the usual library folders), its
// binaries (nvidia-smi, nvidia-debugdump, nvidia-persistenced, nvidia-cuda-mps-control and
// -server, nvidia-imex, nvidia-imex-ctl), IPC sockets (nvidia-persistenced, nvidia-fabricmanager,
// the MPS pipe folder), the GSP firmware of its version, the graphics files, and one hook,
// create-symlinks, whose links (the libraries' SONAME and .so names) the plugin mounts as files.
// Every other hook is off: the plugin uses none.
//
// Usage:
//
//	omaticaya-driver-files --driver-root DIR [--host-driver-root DIR] [--driver-version VERSION]
//
// --driver-root is the driver's root as this program sees it (the agent's container mounts the
// host's at /host/driver-root); --host-driver-root (default: --driver-root) the same folder on
// the host, where the container runtime reads the files: every hostPath printed starts with it
// (the toolkit's transform/root), containerPaths are the toolkit's (the root stripped).
// NVML is never loaded: --driver-version (the agent's reading of nvmlSystemGetDriverVersion)
// is answered by go-nvml's mock; without it the toolkit takes the version from the names of
// libcuda.so.<version> or libnvidia-ml.so.<version> under the root.
//
// Output: one JSON object on stdout, {"driverRoot", "hostDriverRoot", "driverVersion" (the
// flag's, "" without it), "containerEdits" (CDI's containerEdits: env, deviceNodes, mounts,
// hooks)}. Exit status 1 with one line on stderr when the toolkit finds no driver there or
// fails; 2 on a bad command line.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	transformroot "github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform/root"
	"github.com/sirupsen/logrus"
	"tags.cncf.io/container-device-interface/specs-go"
)

// output is what the program prints.
type output struct {
	DriverRoot     string               `json:"driverRoot"`
	HostDriverRoot string               `json:"hostDriverRoot"`
	DriverVersion  string               `json:"driverVersion"`
	ContainerEdits specs.ContainerEdits `json:"containerEdits"`
}

// versionOnly is an NVML that answers the driver's version and nothing else; an empty version
// fails its Init, so that the toolkit infers the version from the libraries' names.
func versionOnly(version string) nvml.Interface {
	return &mock.Interface{
		InitFunc: func() nvml.Return {
			if version == "" {
				return nvml.ERROR_LIBRARY_NOT_FOUND
			}
			return nvml.SUCCESS
		},
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return version, nvml.SUCCESS },
	}
}

// driverFiles returns the toolkit's common edits for the driver under root, their host paths
// moved under hostRoot.
func driverFiles(root, hostRoot, version string) (*specs.ContainerEdits, error) {
	logger := logrus.New()
	logger.SetOutput(os.Stderr)
	logger.SetLevel(logrus.ErrorLevel)
	lib, err := nvcdi.New(
		nvcdi.WithMode(nvcdi.ModeNvml),
		nvcdi.WithDriverRoot(root),
		nvcdi.WithLogger(logger),
		nvcdi.WithNvmlLib(versionOnly(version)),
		nvcdi.WithFeatureFlag(nvcdi.FeatureDisableNvsandboxUtils),
		nvcdi.WithDisabledHooks(nvcdi.AllHooks),
		nvcdi.WithEnabledHooks(nvcdi.CreateSymlinksHook),
	)
	if err != nil {
		return nil, fmt.Errorf("the toolkit's CDI library: %w", err)
	}
	edits, err := lib.GetCommonEdits()
	if err != nil {
		return nil, err
	}
	spec := &specs.Spec{ContainerEdits: *edits.ContainerEdits}
	if hostRoot != root {
		err = transformroot.New(
			transformroot.WithRoot(root),
			transformroot.WithTargetRoot(hostRoot),
			transformroot.WithRelativeTo("host"),
		).Transform(spec)
		if err != nil {
			return nil, fmt.Errorf("moving the host paths from %s to %s: %w", root, hostRoot, err)
		}
	}
	return &spec.ContainerEdits, nil
}

func main() {
	root := flag.String("driver-root", "", "the driver's root folder as this program sees it (required)")
	hostRoot := flag.String("host-driver-root", "", "the same folder on the host (default: --driver-root)")
	version := flag.String("driver-version", "", "the driver's version (default: from the libraries' names)")
	flag.Parse()
	if *hostRoot == "" {
		*hostRoot = *root
	}
	if flag.NArg() != 0 || !filepath.IsAbs(*root) || !filepath.IsAbs(*hostRoot) {
		fmt.Fprintln(os.Stderr, "usage: omaticaya-driver-files --driver-root DIR [--host-driver-root DIR] [--driver-version VERSION] (absolute folders)")
		os.Exit(2)
	}
	edits, err := driverFiles(filepath.Clean(*root), filepath.Clean(*hostRoot), *version)
	if err != nil {
		why := strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; ")
		fmt.Fprintf(os.Stderr, "omaticaya-driver-files: no driver files under %s: %s\n", *root, why)
		os.Exit(1)
	}
	out := output{filepath.Clean(*root), filepath.Clean(*hostRoot), *version, *edits}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "omaticaya-driver-files: %v\n", err)
		os.Exit(1)
	}
}
