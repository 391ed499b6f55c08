//go:build linux

package history

import (
	"io"
	"os"
	"syscall"
)

// openRead opens path read-only for ReadAt/Read without registering it
// with the runtime's poller. os.Open does, for every file: on Linux that
// is an epoll_ctl that fails for a regular file plus four fcntl calls
// around it, six system calls instead of two, and a cold open of a
// database with history opened three such files (the database file, its
// WAL, the staging tip) every time (docs/benchmarks.md, "Cold open").
// Regular files never block in the poller's sense, so nothing is lost.
func openRead(path string) (*os.File, error) {
	for {
		fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: path, Err: err}
		}
		return os.NewFile(uintptr(fd), path), nil
	}
}

// readSmallFile is os.ReadFile for a file of a few hundred bytes (the
// staging tip) opened with openRead: no poller registration, no fstat.
func readSmallFile(path string) ([]byte, error) {
	f, err := openRead(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, 0, 512)
	for {
		n, err := f.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return nil, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
}
