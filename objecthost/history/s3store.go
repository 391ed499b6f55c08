package history

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Config names an S3-compatible bucket (cluster.hcl's archive block).
type S3Config struct {
	Endpoint  string // host:port, no scheme
	Bucket    string
	Prefix    string // prepended to every key ("" or ending in '/')
	Region    string
	AccessKey string
	SecretKey string
	TLS       bool
	// PathStyle forces path-style requests (http://host/bucket/key), which
	// most self-hosted S3 servers need; otherwise minio-go decides.
	PathStyle bool
	// MaxRetries is minio-go's attempts per request (default 1: the
	// shipper retries failed shipments itself, with backoff and a fresh
	// reader; minio-go's own retry seeks the body while net/http may still
	// be reading it after an early error answer (seen as a data race), and
	// a long in-client retry only hides an outage from the lag alarm).
	MaxRetries int
}

// S3Store is a Store in an S3-compatible bucket, through minio-go. A PUT
// is atomic and durable when S3 answers 200, which is the Store contract.
type S3Store struct {
	c      *minio.Client
	bucket string
	prefix string
}

var _ Store = (*S3Store)(nil)

// NewS3Store connects to the bucket (it does not create it).
func NewS3Store(cfg S3Config) (*S3Store, error) {
	opts := &minio.Options{
		Creds:  credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure: cfg.TLS,
		Region: cfg.Region,
	}
	opts.MaxRetries = cfg.MaxRetries
	if opts.MaxRetries <= 0 {
		opts.MaxRetries = 1
	}
	if cfg.PathStyle {
		opts.BucketLookup = minio.BucketLookupPath
	}
	c, err := minio.New(cfg.Endpoint, opts)
	if err != nil {
		return nil, fmt.Errorf("history: s3 client: %w", err)
	}
	if cfg.Prefix != "" && !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	return &S3Store{c: c, bucket: cfg.Bucket, prefix: cfg.Prefix}, nil
}

func (s *S3Store) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	_, err := s.c.PutObject(ctx, s.bucket, s.prefix+key, r, size, minio.PutObjectOptions{
		ContentType: "application/octet-stream",
		// One PUT for what the shipper sends (segments are ≤ a few MB);
		// larger snapshots go multipart in 64 MB parts.
		PartSize: 64 << 20,
	})
	if err != nil {
		return fmt.Errorf("history: s3 put %s: %w", key, err)
	}
	return nil
}

func (s *S3Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	o, err := s.c.GetObject(ctx, s.bucket, s.prefix+key, minio.GetObjectOptions{})
	if err == nil {
		// GetObject is lazy: Stat makes the request and surfaces NoSuchKey.
		if _, err = o.Stat(); err == nil {
			return o, nil
		}
		o.Close()
	}
	if minio.ToErrorResponse(err).Code == minio.NoSuchKey {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return nil, fmt.Errorf("history: s3 get %s: %w", key, err)
}

func (s *S3Store) List(ctx context.Context, prefix string) ([]string, error) {
	var keys []string
	for o := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + prefix, Recursive: true}) {
		if o.Err != nil {
			return nil, fmt.Errorf("history: s3 list %s: %w", prefix, o.Err)
		}
		keys = append(keys, strings.TrimPrefix(o.Key, s.prefix))
	}
	sort.Strings(keys)
	return keys, nil
}

// ListDatabases lists the top level under the store's prefix with a
// delimited listing (DatabaseLister): S3 answers one common prefix per
// database, a page per 1,000 databases.
func (s *S3Store) ListDatabases(ctx context.Context) ([]string, error) {
	var out []string
	for o := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix, Recursive: false}) {
		if o.Err != nil {
			return nil, fmt.Errorf("history: s3 list databases: %w", o.Err)
		}
		if name, ok := strings.CutSuffix(strings.TrimPrefix(o.Key, s.prefix), "/"); ok && name != "" && !strings.Contains(name, "/") {
			out = append(out, name)
		}
	}
	return out, nil
}

func (s *S3Store) Delete(ctx context.Context, key string) error {
	err := s.c.RemoveObject(ctx, s.bucket, s.prefix+key, minio.RemoveObjectOptions{})
	if err != nil && minio.ToErrorResponse(err).Code != minio.NoSuchKey {
		return fmt.Errorf("history: s3 delete %s: %w", key, err)
	}
	return nil
}
