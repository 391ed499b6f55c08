//go:build !linux

package history

import "os"

// openRead is os.Open (see openfile_linux.go).
func openRead(path string) (*os.File, error) { return os.Open(path) }

// readSmallFile is os.ReadFile (see openfile_linux.go).
func readSmallFile(path string) ([]byte, error) { return os.ReadFile(path) }
