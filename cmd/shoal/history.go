package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/objecthost/history"
)

// dirHistory is the object host's history on a directory archive (shoal
// dev's default, or objecthost serve --archive-dir). The archive stands in
// for off-host storage, so it must not live inside the host's data
// directory: wiping that must not wipe the archive.
func dirHistory(archiveDir, dataDir string) (*objecthost.HistoryConfig, error) {
	a, err := filepath.Abs(archiveDir)
	if err != nil {
		return nil, err
	}
	d, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, err
	}
	if a == d || strings.HasPrefix(a, d+string(filepath.Separator)) {
		return nil, fmt.Errorf("--archive-dir %s is inside the data directory %s: the archive must survive losing it", archiveDir, dataDir)
	}
	st, err := history.NewDirStore(a)
	if err != nil {
		return nil, err
	}
	return &objecthost.HistoryConfig{Store: st}, nil
}
