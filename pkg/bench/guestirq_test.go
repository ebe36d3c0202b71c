package bench

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

func TestParseNICInterrupts(t *testing.T) {
	intx := "virtio0\n" +
		"           CPU0       \n" +
		"  0:        108   IO-APIC   2-edge      timer\n" +
		"  4:        100   IO-APIC   4-edge      ttyS0\n" +
		" 22:       4423   IO-APIC  22-fasteoi   virtio0\n" +
		"NMI:          0   Non-maskable interrupts\n"
	msix := "virtio1\r\n" +
		"            CPU0       CPU1\n" +
		" 24:          0          0  PCI-MSIX-0000:01:00.0   0-edge      virtio0-config\n" +
		" 25:         10         20  PCI-MSIX-0000:01:00.0   1-edge      virtio0-input.0\n" +
		" 26:          0          0  PCI-MSIX-0000:02:00.0   0-edge      virtio1-config\n" +
		" 27:        100        200  PCI-MSIX-0000:02:00.0   1-edge      virtio1-input.0\n" +
		" 28:          3          4  PCI-MSIX-0000:02:00.0   2-edge      virtio1-output.0\n" +
		" 29:          5          0  PCI-MSIX-0000:03:00.0   1-edge      virtio10-input.0\n" +
		"LOC:      11695      11000   Local timer interrupts\n"
	for _, c := range []struct {
		name, in string
		want     uint64
	}{
		{"INTx: the device's one line", intx, 4423},
		{"MSI-X: every vector of eth0's device, every CPU; not virtio0 or virtio10", msix, 307},
	} {
		got, err := parseNICInterrupts(c.in)
		if err != nil || got != c.want {
			t.Errorf("%s: got %d, %v; want %d", c.name, got, err, c.want)
		}
	}
	for _, c := range []struct{ name, in string }{
		{"empty", ""},
		{"no device line", "\n           CPU0\n 22: 1 IO-APIC 22-fasteoi virtio0\n"},
		{"the device has no line", "virtio3\n           CPU0\n 22: 1 IO-APIC 22-fasteoi virtio0\n"},
		{"no CPU header", "virtio0\n 22: 1 IO-APIC 22-fasteoi virtio0\n x\n"},
		{"garbage count", "virtio0\n           CPU0\n 22: 1x IO-APIC 22-fasteoi virtio0\n"},
		{"an error message", "readlink: /sys/class/net/eth0/device: No such file\ncat: /proc/interrupts: oops\n"},
	} {
		if n, err := parseNICInterrupts(c.in); err == nil {
			t.Errorf("%s: got %d, want an error", c.name, n)
		}
	}
}

func TestIRQDelta(t *testing.T) {
	if n, ok := irqDelta(100, 600, true, true); !ok || n != 500 {
		t.Errorf("irqDelta = %d, %v; want 500, true", n, ok)
	}
	if got := (hostCPURun{irqs: 500, irqsOK: true}).irqsPer(250); got != 2 {
		t.Errorf("irqsPer = %v, want 2", got)
	}
	for _, c := range []struct {
		b, a   uint64
		ob, oa bool
	}{{100, 600, false, true}, {100, 600, true, false}, {600, 100, true, true}} {
		n, ok := irqDelta(c.b, c.a, c.ob, c.oa)
		if got := (hostCPURun{irqs: n, irqsOK: ok}).irqsPer(250); ok || !math.IsNaN(got) {
			t.Errorf("irqDelta(%+v) = %d, %v (%v per unit), want not counted (NaN)", c, n, ok, got)
		}
	}
	if got := (hostCPURun{irqs: 500, irqsOK: true}).irqsPer(0); !math.IsNaN(got) {
		t.Errorf("irqsPer(0) = %v, want NaN", got)
	}
}

func TestWriteGuestIRQs(t *testing.T) {
	hc := &HostCPU{
		IRQPerMB: Summary{Min: 15, Median: 20, Max: 25}, IRQPerMBRev: Summary{Min: 10, Median: 18, Max: 20},
		IRQPerTxn: Summary{Min: 1, Median: 2, Max: 3},
		Parts: []HostCPUPart{{Name: "qemu without vCPUs", NsPerByte: Summary{Median: 4}, NsPerByteRev: Summary{Median: 3.6},
			UsPerTxn: Summary{Median: 90}}},
	}
	var b bytes.Buffer
	writeGuestIRQs(&b, hc)
	out := b.String()
	// 4 ns/byte = 4,000,000 ns per MB over 20 interrupts: 200 µs each; 3.6e6 / 18: 200; 90 µs / 2: 45.
	for _, want := range []string{"20.0 (15.0–25.0) per MB to the guest", "2.00 (1.00–3.00) per transaction",
		"qemu without vCPUs CPU per guest interrupt: 200 µs to the guest, 200 from it, 45 in RR"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	b.Reset()
	writeGuestIRQs(&b, &HostCPU{Parts: hc.Parts})
	if b.Len() != 0 {
		t.Errorf("no interrupts counted: printed %q, want nothing", b.String())
	}
}
