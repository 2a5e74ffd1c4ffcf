package image

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxBytesEnv names the operator's setting that bounds how much an image may unpack to
// (Store.MaxLayerBytes; the mains read it).
const MaxBytesEnv = "LAZYFORK_MAX_LAYER_BYTES"

// DefaultMaxBytes is the bound when the setting is unset: 8 GiB of unpacked layers per
// image (file data plus 512 bytes per tar entry).
const DefaultMaxBytes int64 = 8 << 30

// ErrRefused is wrapped by errors about layer content LazyFork will not unpack (a
// hostile or malformed entry, an image over the size limit), as opposed to a damaged
// or unreadable source.
var ErrRefused = errors.New("layer refused")

// SizeLimitError is returned when an image would unpack to more than the limit.
type SizeLimitError struct {
	Limit  int64
	Source string // where the limit came from, for the message
}

func (e *SizeLimitError) Error() string {
	return fmt.Sprintf("image unpacks to more than %s, the limit (%s); set %s to a larger size (for example %s=%s) if you trust the image",
		binBytes(e.Limit), e.Source, MaxBytesEnv, MaxBytesEnv, binBytes(2*e.Limit))
}

func (e *SizeLimitError) Unwrap() error { return ErrRefused }

// refused marks err as a refusal of layer content.
type refusedError struct{ msg string }

func (e *refusedError) Error() string { return e.msg }
func (e *refusedError) Unwrap() error { return ErrRefused }

func refusef(format string, args ...any) error {
	return &refusedError{fmt.Sprintf(format, args...)}
}

// maxBytes returns the unpacked-size bound for one image (-1: none) and where it came
// from, for the message: Store.MaxLayerBytes, else DefaultMaxBytes.
func (s *Store) maxBytes() (int64, string, error) {
	v := strings.TrimSpace(s.MaxLayerBytes)
	if v == "" {
		return DefaultMaxBytes, "default, " + MaxBytesEnv + " is unset", nil
	}
	n, err := ParseBytes(v)
	if err != nil {
		return 0, "", fmt.Errorf("%s=%q: %w; give bytes, or a number with K, M, G or T (powers of 1024), or 0 for no limit", MaxBytesEnv, v, err)
	}
	if n == 0 {
		return -1, MaxBytesEnv, nil
	}
	return n, "from " + MaxBytesEnv, nil
}

// ParseBytes reads a size such as "8589934592", "512M", "8G" or "8GiB" (powers of 1024).
func ParseBytes(v string) (int64, error) {
	s := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(v)), "B"), "I")
	if strings.EqualFold(v, "none") {
		return 0, nil
	}
	mult := int64(1)
	if s != "" {
		switch s[len(s)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult != 1 {
			s = s[:len(s)-1]
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, errors.New("not a size")
	}
	if n > (1<<62)/mult {
		return 0, errors.New("too large")
	}
	return n * mult, nil
}

// binBytes formats n in powers of 1024, exactly when it is a whole number of units.
func binBytes(n int64) string {
	for _, u := range []struct {
		s string
		n int64
	}{{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if n >= u.n && n%u.n == 0 {
			return fmt.Sprintf("%d%s", n/u.n, u.s)
		}
	}
	return strconv.FormatInt(n, 10)
}
