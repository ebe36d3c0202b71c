package procstat

import (
	"os"
	"testing"
	"time"
)

func TestSelf(t *testing.T) {
	// Touch some memory and burn some CPU so both read non-zero.
	buf := make([]byte, 8<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	for start := time.Now(); time.Since(start) < 30*time.Millisecond; {
	}
	for _, pid := range []int{0, os.Getpid()} {
		rss, err := RSS(pid)
		if err != nil || rss < 8<<20 {
			t.Errorf("RSS(%d) = %d, %v; want >= 8 MiB (a buffer of that size is resident)", pid, rss, err)
		}
		st, err := Status(pid)
		if err != nil || st["VmHWM"] < rss || st["RssAnon"] == 0 {
			t.Errorf("Status(%d): VmHWM %d RssAnon %d, %v; want a peak >= RSS %d and anonymous memory", pid, st["VmHWM"], st["RssAnon"], err, rss)
		}
		cpu, err := CPU(pid)
		if err != nil || cpu < 20*time.Millisecond {
			t.Errorf("CPU(%d) = %v, %v; want >= 20ms (the loop above)", pid, cpu, err)
		}
	}
	_ = buf[len(buf)-1]
	if _, err := RSS(1 << 30); err == nil {
		t.Error("RSS of a process that cannot exist: no error")
	}
}
