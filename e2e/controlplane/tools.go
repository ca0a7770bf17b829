//go:build tools

// Package controlplane only records the commands build.sh compiles, so that `go mod tidy`
// keeps their dependencies in go.sum.
package controlplane

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
