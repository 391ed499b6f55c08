//go:build !linux

package srvruntime

import "errors"

func reexec([]string) error { return errors.New("re-execution is only done on linux") }
