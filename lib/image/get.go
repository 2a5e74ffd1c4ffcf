package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sys/unix"
)

// GetOptions tunes Get.
type GetOptions struct {
	Progress io.Writer // human-readable progress lines (meant for stderr); nil for none
	Insecure bool      // allow plain-http registries (localhost ones always are)
}

// Get returns the image ref, fetching it into the store if needed. ref is, in order:
// a stored name or alias; the default image name (built with BuildDefault); an existing
// path to an OCI layout directory or a `docker save` tarball, optionally followed by
// ":TAG" to pick one of several images; otherwise a registry reference, pulled.
func (s *Store) Get(ctx context.Context, ref string, opts GetOptions) (*Image, error) {
	img, err := s.Resolve(ref)
	if err == nil || !errors.Is(err, ErrNotFound) {
		return img, err
	}
	if _, _, err := s.maxBytes(); err != nil {
		return nil, fmt.Errorf("get image %s: %w", ref, err)
	}
	if canonical(ref) == DefaultName {
		return s.BuildDefault(ctx, opts.Progress)
	}
	loc, err := findLocal(ref)
	if err != nil {
		return nil, err
	}
	if loc != nil {
		return s.importLocal(ctx, loc, opts)
	}
	return s.pull(ctx, ref, opts)
}

// local is an image source on disk.
type local struct {
	path     string
	selector string // tag after "PATH:", or ""
	layout   bool   // an OCI layout dir, else a docker archive
}

func isLayoutDir(p string) bool {
	st, err := os.Stat(filepath.Join(p, "oci-layout"))
	return err == nil && st.Mode().IsRegular()
}

func looksLikePath(ref string) bool {
	return strings.HasPrefix(ref, "/") || strings.HasPrefix(ref, "./") || strings.HasPrefix(ref, "../") ||
		strings.HasSuffix(ref, ".tar") || strings.HasSuffix(ref, ".tar.gz") || strings.HasSuffix(ref, ".tgz")
}

// findLocal decides whether ref names a file or directory (possibly as PATH:TAG).
func findLocal(ref string) (*local, error) {
	check := func(p string) (*local, bool) {
		st, err := os.Stat(p)
		switch {
		case err != nil:
			return nil, false
		case st.IsDir() && isLayoutDir(p):
			return &local{path: p, layout: true}, true
		case st.Mode().IsRegular():
			return &local{path: p}, true
		}
		return nil, false
	}
	if l, ok := check(ref); ok {
		return l, nil
	}
	for i := 0; i < len(ref); i++ {
		if ref[i] != ':' {
			continue
		}
		if l, ok := check(ref[:i]); ok {
			l.selector = ref[i+1:]
			return l, nil
		}
	}
	if st, err := os.Stat(ref); err == nil && st.IsDir() && looksLikePath(ref) {
		return nil, fmt.Errorf("get image %s: a directory but not an OCI image layout (no oci-layout file)", ref)
	}
	if looksLikePath(ref) {
		p, _, _ := strings.Cut(ref, ":")
		return nil, fmt.Errorf("get image %s: no such file or directory %s", ref, p)
	}
	return nil, nil
}

func (s *Store) importLocal(ctx context.Context, loc *local, opts GetOptions) (*Image, error) {
	abs, err := filepath.Abs(loc.path)
	if err != nil {
		return nil, fmt.Errorf("get image %s: %w", loc.path, err)
	}
	loc.path = abs
	lk, err := s.lockName(ctx, "path:"+abs+":"+loc.selector)
	if err != nil {
		return nil, fmt.Errorf("get image %s: %w", abs, err)
	}
	defer lk.unlock()
	if loc.layout {
		src, meta, err := openLayout(abs, loc.selector)
		if err != nil {
			return nil, fmt.Errorf("read OCI layout %s: %w", abs, err)
		}
		prog := newProgress(opts.Progress, nil)
		prog.printf("import %s from OCI layout %s\n", meta.Name, abs)
		img, err := s.unpackImage(ctx, src, meta, prog)
		if err != nil {
			return nil, fmt.Errorf("import OCI layout %s: %w", abs, err)
		}
		return img, nil
	}
	hint := func(err error) error {
		return fmt.Errorf("read image archive %s: %s; is it a `docker save` tarball?", abs, oneLine(err))
	}
	src, meta, err := openArchive(abs, loc.selector)
	if err != nil {
		return nil, hint(err)
	}
	prog := newProgress(opts.Progress, nil)
	prog.printf("import %s from %s\n", meta.Name, abs)
	img, err := s.unpackImage(ctx, src, meta, prog)
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, ErrRefused) {
			return nil, fmt.Errorf("import image archive %s: %w", abs, err)
		}
		return nil, hint(err)
	}
	return img, nil
}

// oneLine keeps an error message on one line (the CLI prints errors as one line).
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}

func (s *Store) pull(ctx context.Context, ref string, opts GetOptions) (*Image, error) {
	var nopts []name.Option
	if opts.Insecure || isLocalhost(ref) {
		nopts = append(nopts, name.Insecure)
	}
	r, err := name.ParseReference(ref, nopts...)
	if err != nil {
		return nil, fmt.Errorf("get image %s: not a stored image, an existing file or a valid registry reference: %w", ref, err)
	}
	key := r.Name()
	lk, err := s.lockName(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", key, err)
	}
	defer lk.unlock()
	if img, err := s.Resolve(key); err == nil {
		return img, nil // a concurrent Get pulled it while we waited
	}
	ct := &countingTransport{base: remote.DefaultTransport}
	prog := newProgress(opts.Progress, &ct.n)
	src, err := remote.Image(r,
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}),
		remote.WithTransport(ct),
		remote.WithUserAgent("lazyfork"))
	if err != nil {
		return nil, fmt.Errorf("unknown image %s: not in the local store (lazyfork image list) and the pull of %s failed: %s", ref, key, oneLine(err))
	}
	prog.printf("pull %s\n", key)
	dg, err := src.Digest()
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", key, err)
	}
	img, err := s.unpackImage(ctx, src, Image{Name: key, Digest: dg.String(), Source: SourceRegistry}, prog)
	if err != nil {
		if errors.Is(err, ErrRefused) {
			return nil, fmt.Errorf("pull %s: %w", key, err)
		}
		return nil, fmt.Errorf("pull %s: %s", key, oneLine(err))
	}
	return img, nil
}

func isLocalhost(ref string) bool {
	host, _, _ := strings.Cut(ref, "/")
	if !strings.Contains(ref, "/") {
		return false
	}
	if h, _, ok := strings.Cut(host, ":"); ok && !strings.HasPrefix(host, "[") {
		host = h
	}
	return host == "localhost" || host == "127.0.0.1" || host == "[::1]" || strings.HasPrefix(host, "[::1]:")
}

// unpackImage unpacks every layer of src not yet in the store and writes the record.
// The caller holds the name lock. On failure, layers this call created are removed.
func (s *Store) unpackImage(ctx context.Context, src v1.Image, meta Image, prog *progress) (_ *Image, retErr error) {
	cfg, err := src.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read image config: %w", err)
	}
	if cfg.OS != "" && cfg.OS != "linux" || cfg.Architecture != "" && cfg.Architecture != runtime.GOARCH {
		return nil, fmt.Errorf("image is for %s/%s, this machine runs linux/%s", cfg.OS, cfg.Architecture, runtime.GOARCH)
	}
	layers, err := src.Layers()
	if err != nil {
		return nil, fmt.Errorf("read image layers: %w", err)
	}
	sl, err := s.lockStore(ctx, unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	var created []string
	defer func() {
		if retErr != nil && len(created) > 0 {
			// Upgrade to exclusive, so no concurrent Get is about to reference them.
			sl.unlock()
			if xl, err := s.lockStore(context.Background(), unix.LOCK_EX); err == nil {
				mounted, _ := mountedLowerDirs()
				if err := s.sweepLayers(created, mounted); err != nil {
					retErr = errors.Join(retErr, err)
				}
				xl.unlock()
			}
		}
		sl.unlock()
	}()

	limit, source, err := s.maxBytes()
	if err != nil {
		return nil, err
	}
	lim := &sizeLimit{limit: limit, source: source}
	out := meta
	out.Layers = nil
	for i, l := range layers {
		dir, fresh, size, err := s.layer(ctx, l, i, len(layers), prog, meta.Source == SourceRegistry, lim)
		if err != nil {
			var sl *SizeLimitError
			if errors.As(err, &sl) {
				return nil, err
			}
			return nil, fmt.Errorf("layer %d/%d: %w", i+1, len(layers), err)
		}
		if fresh {
			created = append(created, dir)
		}
		out.Size += size
		// An empty layer changes nothing in an overlay; skip it, which also keeps a
		// repeated empty layer from naming one lower dir twice.
		if empty, _ := isEmptyDir(dir); empty && (len(layers) > 1) {
			continue
		}
		out.Layers = append(out.Layers, dir)
	}
	if len(out.Layers) == 0 && len(layers) > 0 {
		dir, _ := s.layerPath(layers[len(layers)-1])
		out.Layers = []string{dir}
	}
	c := cfg.Config
	out.Env, out.Cmd, out.Entrypoint, out.WorkingDir, out.User = c.Env, c.Cmd, c.Entrypoint, c.WorkingDir, c.User
	if err := s.writeRef(&out); err != nil {
		return nil, err
	}
	prog.printf("stored %s (%s, %d layers, %s)\n", out.Name, shortDigest(out.Digest), len(layers), humanBytes(out.Size))
	return &out, nil
}

func (s *Store) layerPath(l v1.Layer) (string, error) {
	d, err := l.DiffID()
	if err != nil {
		return "", fmt.Errorf("read diff ID: %w", err)
	}
	if d.Algorithm != "sha256" || len(d.Hex) != 64 || strings.Trim(d.Hex, "0123456789abcdef") != "" {
		return "", fmt.Errorf("unsupported diff ID %s", d)
	}
	return filepath.Join(s.layersDir(), d.Hex), nil
}

// sizeLimit is what is left of an image's unpacked-size bound while its layers unpack.
type sizeLimit struct {
	limit  int64 // < 0: none
	source string
	used   int64
}

// budget is what the next layer may charge (0: no bound).
func (l *sizeLimit) budget() int64 {
	if l.limit < 0 {
		return 0
	}
	return max(1, l.limit-l.used)
}

func (l *sizeLimit) add(n int64) error {
	l.used += n
	if l.limit >= 0 && l.used > l.limit {
		return &SizeLimitError{Limit: l.limit, Source: l.source}
	}
	return nil
}

// layer makes sure one layer is unpacked; fresh reports whether this call did it.
func (s *Store) layer(ctx context.Context, l v1.Layer, i, n int, prog *progress, remote bool, lim *sizeLimit) (dir string, fresh bool, size int64, err error) {
	dir, err = s.layerPath(l)
	if err != nil {
		return "", false, 0, err
	}
	d := "sha256:" + filepath.Base(dir)
	if _, err := os.Stat(dir); err == nil {
		prog.printf("  layer %d/%d %s: already present\n", i+1, n, shortDigest(d))
		size, err := treeSize(dir)
		if err == nil {
			err = lim.add(size)
		}
		return dir, false, size, err
	}
	var total int64
	if remote {
		total, _ = l.Size() // compressed size, from the manifest
	}
	prog.startLayer(i, n, shortDigest(d), total)
	t, err := s.newTemp()
	if err != nil {
		return "", false, 0, err
	}
	defer t.discard()

	rc, err := l.Uncompressed()
	if err != nil {
		return "", false, 0, fmt.Errorf("open layer %s: %w", shortDigest(d), err)
	}
	h := sha256.New()
	lr := &layerReader{ctx: ctx, r: io.TeeReader(rc, h), tick: prog.tick}
	res, err := unpackLayer(lr, t.path, unpackOptions{Budget: lim.budget(), Limit: lim.limit, LimitSource: lim.source})
	size = res.Size
	if err == nil {
		err = lim.add(res.Charged)
	}
	if err == nil {
		// Read the tar's padding and the compressed stream's end, so the hash is
		// complete and the registry layer's digest check (at EOF) runs.
		_, err = io.Copy(io.Discard, lr)
	}
	if cerr := rc.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		var sl *SizeLimitError
		if errors.As(err, &sl) {
			return "", false, 0, err
		}
		return "", false, 0, fmt.Errorf("unpack layer %s: %w", shortDigest(d), err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != filepath.Base(dir) {
		return "", false, 0, fmt.Errorf("layer %s: content has diff ID sha256:%s; the image is corrupt", shortDigest(d), got)
	}
	if err := t.commit(dir); err != nil {
		return "", false, 0, err
	}
	if len(res.Skipped) > 0 {
		prog.printf("%s: skipped %d device node(s) (%s): containers get their own /dev\n", prog.prefix, len(res.Skipped), strings.Join(firstN(res.Skipped, 3), ", "))
	}
	prog.doneLayer(size)
	return dir, true, size, nil
}

func isEmptyDir(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if err == io.EOF {
		return true, nil
	}
	return len(names) == 0, err
}

// treeSize sums the sizes of regular files below dir, counting hardlinks once.
func treeSize(dir string) (int64, error) {
	var total int64
	seen := map[[2]uint64]bool{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if st.Nlink > 1 {
			k := [2]uint64{st.Dev, st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		total += st.Size
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("measure %s: %w", dir, err)
	}
	return total, nil
}

// layerReader stops on cancellation and reports progress at most once a second.
type layerReader struct {
	ctx  context.Context
	r    io.Reader
	n    int64
	tick func(n int64)
	last time.Time
}

func (lr *layerReader) Read(p []byte) (int, error) {
	if err := lr.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := lr.r.Read(p)
	lr.n += int64(n)
	if lr.tick != nil && time.Since(lr.last) >= time.Second {
		if !lr.last.IsZero() {
			lr.tick(lr.n)
		}
		lr.last = time.Now()
	}
	return n, err
}

// countingTransport counts response body bytes, i.e. bytes downloaded. Blob requests
// may be redirected to a CDN, so counting by URL would miss them.
type countingTransport struct {
	base http.RoundTripper
	n    atomic.Int64
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err == nil && resp.Body != nil {
		resp.Body = &countingBody{ReadCloser: resp.Body, n: &t.n}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// progress writes human-readable lines; all methods are no-ops without a writer.
type progress struct {
	w          io.Writer
	downloaded *atomic.Int64 // bytes off the network, or nil for local sources
	prefix     string
	total      int64
	start      int64
}

func newProgress(w io.Writer, downloaded *atomic.Int64) *progress {
	return &progress{w: w, downloaded: downloaded}
}

func (p *progress) printf(format string, args ...any) {
	if p.w != nil {
		fmt.Fprintf(p.w, format, args...)
	}
}

func (p *progress) startLayer(i, n int, digest string, total int64) {
	p.prefix = fmt.Sprintf("  layer %d/%d %s", i+1, n, digest)
	p.total = total
	if p.downloaded != nil {
		p.start = p.downloaded.Load()
	}
	if total > 0 {
		p.printf("%s: downloading %s\n", p.prefix, humanBytes(total))
	} else {
		p.printf("%s: unpacking\n", p.prefix)
	}
}

func (p *progress) tick(unpacked int64) {
	if p.downloaded != nil && p.total > 0 {
		got := p.downloaded.Load() - p.start
		p.printf("%s: %d%% (%s of %s)\n", p.prefix, min(100, got*100/p.total), humanBytes(got), humanBytes(p.total))
		return
	}
	p.printf("%s: %s unpacked\n", p.prefix, humanBytes(unpacked))
}

func (p *progress) doneLayer(size int64) {
	p.printf("%s: done, %s unpacked\n", p.prefix, humanBytes(size))
}

func humanBytes(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1f GB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%d B", n)
}

func shortDigest(d string) string {
	if alg, h, ok := strings.Cut(d, ":"); ok && len(h) > 12 {
		return alg + ":" + h[:12]
	}
	return d
}

// firstN is at most n elements of l, with "..." appended when some were left off.
func firstN(l []string, n int) []string {
	if len(l) <= n {
		return l
	}
	return append(l[:n:n], "...")
}

// listNames formats image names for an error that asks the user to pick one.
func listNames(names []string) string {
	sort.Strings(names)
	return strings.Join(names, ", ")
}
