package procfs

import (
	"os"
	"testing"
)

func TestParseStat(t *testing.T) {
	line := "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 123456 1000 10 18446744073709551615\n"
	st, err := ParseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if st.Comm != "a) b (c)" || st.State != 'S' || st.PPid != 1 || st.UTime != 7 || st.STime != 3 || st.StartTime != 123456 {
		t.Errorf("parsed %+v", st)
	}
	for _, bad := range []string{"", "1 x S 1", "1 (x) S 1 2 3", "1 (x) S one 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0"} {
		if _, err := ParseStat([]byte(bad)); err == nil {
			t.Errorf("ParseStat(%q) accepted", bad)
		}
	}
	// /proc/PID/stat shows the main thread, which may sleep while this goroutine's
	// thread reads it: alive is all that can be asked (CI saw 'S' once under load).
	self, err := ReadStat(os.Getpid())
	if err != nil || self.PPid != os.Getppid() || self.StartTime == 0 || (self.State != 'R' && self.State != 'S') {
		t.Errorf("own stat: %+v, %v", self, err)
	}
}
