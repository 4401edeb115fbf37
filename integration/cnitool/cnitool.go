// cnitool: libcni's own runner, as the CNI project's cnitool command behaves, built from the
// libcni Debian ships (golang-github-appc-cni-dev, which has no cnitool binary). Used by the VM
// scenario and the Vagrant provisioning as the "client nobody here wrote" in front of pycni.
//
//	cnitool add|check|del <network> <netns path>
//
// Environment, as upstream: NETCONFPATH (conflist dir, default /etc/cni/net.d), CNI_PATH,
// CNI_ARGS ("K=V;K=V"), CAP_ARGS (JSON capability args), CNI_IFNAME (default eth0). The container
// ID is "cnitool-" + the first 20 hex digits of sha512(netns path).
package main

import (
	"context"
	"crypto/sha512"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "cnitool: "+format+"\n", args...)
	os.Exit(1)
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: %s add|check|del <net> <netns>\n", filepath.Base(os.Args[0]))
	os.Exit(1)
}

func main() {
	if len(os.Args) < 4 {
		usage()
	}
	command, network, netns := os.Args[1], os.Args[2], os.Args[3]

	confDir := os.Getenv("NETCONFPATH")
	if confDir == "" {
		confDir = "/etc/cni/net.d"
	}
	list, err := libcni.LoadConfList(confDir, network)
	if err != nil {
		fail("loading network %q from %s: %v", network, confDir, err)
	}

	var capArgs map[string]interface{}
	if s := os.Getenv("CAP_ARGS"); s != "" {
		if err := json.Unmarshal([]byte(s), &capArgs); err != nil {
			fail("CAP_ARGS is not a JSON object: %v", err)
		}
	}
	var cniArgs [][2]string
	if s := os.Getenv("CNI_ARGS"); s != "" {
		for _, pair := range strings.Split(s, ";") {
			kv := strings.SplitN(pair, "=", 2)
			if len(kv) != 2 {
				fail("CNI_ARGS: invalid pair %q", pair)
			}
			cniArgs = append(cniArgs, [2]string{kv[0], kv[1]})
		}
	}
	ifName := os.Getenv("CNI_IFNAME")
	if ifName == "" {
		ifName = "eth0"
	}
	netnsPath, err := filepath.Abs(netns)
	if err != nil {
		fail("netns path %q: %v", netns, err)
	}
	sum := sha512.Sum512([]byte(netnsPath))
	rt := &libcni.RuntimeConf{
		ContainerID:    fmt.Sprintf("cnitool-%x", sum[:10]),
		NetNS:          netnsPath,
		IfName:         ifName,
		Args:           cniArgs,
		CapabilityArgs: capArgs,
	}
	cni := libcni.NewCNIConfig(filepath.SplitList(os.Getenv("CNI_PATH")), nil)
	ctx := context.TODO()

	switch command {
	case "add":
		result, err := cni.AddNetworkList(ctx, list, rt)
		if result != nil {
			_ = result.Print()
		}
		if err != nil {
			fail("add: %v", err)
		}
	case "check":
		if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
			fail("check: %v", err)
		}
	case "del":
		if err := cni.DelNetworkList(ctx, list, rt); err != nil {
			fail("del: %v", err)
		}
	default:
		usage()
	}
}
