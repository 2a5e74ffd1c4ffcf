package criu

import (
	"encoding/binary"
	"fmt"
	"os"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/stats"
	"google.golang.org/protobuf/proto"
)

// The stats file layout. go-criu's own stats package registers the same proto as
// crit/images/stats, and a binary linking both (lf-memfile with lib/criu) panics at
// start-up on the name conflict, so only crit's type is used.
const (
	imgServiceMagic      = 0x55105940
	statsMagic           = 0x57093306
	primaryMagicOffset   = 0x0
	secondaryMagicOffset = 0x4
	sizeOffset           = 0x8
	payloadOffset        = 0xC
)

// readStats decodes a stats-dump or stats-restore file: two magics, a size, one entry.
// (go-criu's own reader slices without bounds checks and panics on a truncated file.)
func readStats(path string) (*stats.StatsEntry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read stats: %w", err)
	}
	if len(b) < payloadOffset {
		return nil, fmt.Errorf("read stats %s: truncated", path)
	}
	if binary.LittleEndian.Uint32(b[primaryMagicOffset:]) != imgServiceMagic ||
		binary.LittleEndian.Uint32(b[secondaryMagicOffset:]) != statsMagic {
		return nil, fmt.Errorf("read stats %s: bad magic", path)
	}
	n := binary.LittleEndian.Uint32(b[sizeOffset:])
	if uint64(len(b)-payloadOffset) < uint64(n) {
		return nil, fmt.Errorf("read stats %s: truncated", path)
	}
	st := &stats.StatsEntry{}
	if err := proto.Unmarshal(b[payloadOffset:payloadOffset+int(n)], st); err != nil {
		return nil, fmt.Errorf("read stats %s: %w", path, err)
	}
	return st, nil
}
