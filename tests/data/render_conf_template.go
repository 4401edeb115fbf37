// render_conf_template renders a CNI conf_template the way containerd's CRI plugin does in
// UpdateRuntimeConfig (text/template.ParseFiles, no extra functions; the same three fields,
// Routes from the CIDRs' families, IPv4 first): render_conf_template TEMPLATE "CIDR[,CIDR]".
// Standard library only; run by tests/test_conf_template.py with `go run`.
package main

import (
	"fmt"
	"net"
	"os"
	"strings"
	"text/template"
)

type cniConfigTemplate struct {
	PodCIDR       string
	PodCIDRRanges []string
	Routes        []string
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: render_conf_template TEMPLATE CIDR[,CIDR]")
		os.Exit(2)
	}
	cidrs := strings.Split(os.Args[2], ",")
	hasV4, hasV6 := false, false
	for i := range cidrs {
		cidrs[i] = strings.TrimSpace(cidrs[i])
		_, n, err := net.ParseCIDR(cidrs[i])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if n.IP.To4() != nil {
			hasV4 = true
		} else {
			hasV6 = true
		}
	}
	var routes []string
	if hasV4 {
		routes = append(routes, "0.0.0.0/0")
	}
	if hasV6 {
		routes = append(routes, "::/0")
	}
	t, err := template.ParseFiles(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	data := cniConfigTemplate{PodCIDR: cidrs[0], PodCIDRRanges: cidrs, Routes: routes}
	if err := t.Execute(os.Stdout, data); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
