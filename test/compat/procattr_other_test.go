//go:build !linux

package compat

import "syscall"

func childProcAttr() *syscall.SysProcAttr { return nil }
