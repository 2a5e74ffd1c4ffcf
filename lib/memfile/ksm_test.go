package memfile

import (
	"context"
	"testing"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/pagemap"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/vma"
	"golang.org/x/sys/unix"
)

// With KSM the VMAs moved into memory files carry MADV_MERGEABLE (CRIU restores the
// bit); a VMA left as it was keeps its own bits; without KSM nothing is marked.
func TestRewriteKSMSynthetic(t *testing.T) {
	for _, ksm := range []bool{false, true} {
		img, family := t.TempDir(), shmDir(t)
		tk := synthTask{pid: 1, vmas: []*vma.VmaEntry{
			vmaE(0, 4, statusAnon, anonPrivateFlag, 0, 0),                     // moved
			vmaE(8, 10, statusAnon, anonPrivateFlag|unix.MAP_GROWSDOWN, 0, 0), // a stack: kept
		}, pm: []*pagemap.PagemapEntry{pmE(0, 2), pmE(8, 1)}}
		for _, b := range []byte{'a', 'b', 's'} {
			tk.pages = append(tk.pages, page(b)...)
		}
		writeSynth(t, img, nil, tk)
		if _, err := Rewrite(context.Background(), Options{CheckpointDir: img, FamilyDir: family, Prefix: "k", KSM: ksm}); err != nil {
			t.Fatal(err)
		}
		vmas := loadMM(t, img, 1)
		if moved := vmas[0].GetMadv()&madvMergeable != 0; moved != ksm {
			t.Errorf("KSM %v: moved VMA mergeable %v (madv %#x)", ksm, moved, vmas[0].GetMadv())
		}
		if vmas[0].GetStatus() != statusFilePriv {
			t.Errorf("KSM %v: VMA 0 not moved (status %#x)", ksm, vmas[0].GetStatus())
		}
		if vmas[1].GetMadv()&madvMergeable != 0 {
			t.Errorf("KSM %v: the kept stack was marked mergeable", ksm)
		}
	}
}
