//go:build !linux

package objecthost

import "os"

func fdatasync(f *os.File) error { return f.Sync() }
