//go:build sarama140

// The sarama 1.40 build (tag sarama140) runs the one-shot modes only.
package main

import (
	"context"
	"errors"
)

var errNoMembers = errors.New("the member modes are in the current build only")

func franzMember(context.Context) error  { return errNoMembers }
func saramaMember(context.Context) error { return errNoMembers }
