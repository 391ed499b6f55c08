package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/shoaldb/shoal/internal/config"

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

// archiveHistory is the object host's history from cluster.hcl's archive
// block: a directory (as dirHistory) or an S3-compatible bucket, with the
// durability mode and lag bounds it names.
func archiveHistory(a *config.Archive, dataDir string) (*objecthost.HistoryConfig, error) {
	var h *objecthost.HistoryConfig
	if a.Dir != "" {
		var err error
		if h, err = dirHistory(a.Dir, dataDir); err != nil {
			return nil, err
		}
	} else {
		secret := os.Getenv("SHOAL_ARCHIVE_SECRET_KEY")
		if a.SecretKeyFile != "" {
			b, err := os.ReadFile(a.SecretKeyFile)
			if err != nil {
				return nil, fmt.Errorf("archive secret_key_file: %w", err)
			}
			secret = strings.TrimRight(string(b), "\r\n")
		}
		tls := a.TLS == nil || *a.TLS
		st, err := history.NewS3Store(history.S3Config{Endpoint: a.Endpoint, Bucket: a.Bucket, Prefix: a.Prefix,
			Region: a.Region, AccessKey: a.AccessKey, SecretKey: secret, TLS: tls, PathStyle: a.PathStyle})
		if err != nil {
			return nil, err
		}
		h = &objecthost.HistoryConfig{Store: st}
	}
	h.Archived = a.Durability == "archived"
	h.DeletedArchiveMassFloor = a.DeletedArchiveMassFloor
	// Validated by config.Load: positive durations or empty.
	if a.MaxLag != "" {
		h.Shipper.MaxLag, _ = time.ParseDuration(a.MaxLag)
	}
	if a.AlarmLag != "" {
		h.Shipper.AlarmLag, _ = time.ParseDuration(a.AlarmLag)
	}
	switch a.ScrubInterval {
	case "":
	case "off":
		h.ScrubInterval = -1
	default:
		h.ScrubInterval, _ = time.ParseDuration(a.ScrubInterval)
	}
	h.ScrubSample = a.ScrubSample
	switch a.BucketSweepInterval {
	case "":
	case "off":
		h.BucketSweepInterval = -1
	default:
		h.BucketSweepInterval, _ = time.ParseDuration(a.BucketSweepInterval)
	}
	return h, nil
}
