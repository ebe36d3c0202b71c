//go:build nolab

package main

import (
	"k8s.io/client-go/rest"

	"github.com/lanekit/lanekit/pkg/conncheck"
)

// labConnRuntime: the shipped binary has no lab.
var labConnRuntime func() (conncheck.Runtime, *rest.Config, error)
