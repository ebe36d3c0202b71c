package bench

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Guest interrupts of the host CPU rows (issue 37): how many interrupts the
// guest's virtio NIC took per MB and per transaction, read in the guest's
// /proc/interrupts around each fixed-load run (outside its CPU window).
// Under TCG every interrupt of a vhost-user NIC is relayed by QEMU's main
// loop (a backend's call eventfd, then the injection: no irqfd without KVM),
// so beside "QEMU without vCPUs" it says what each relay costs.

// guestIRQScript prints the virtio device behind eth0, then the interrupts.
const guestIRQScript = "basename $(readlink /sys/class/net/eth0/device); cat /proc/interrupts"

// NICInterrupts returns the interrupts the guest's eth0 (its virtio device:
// INTx "virtio0", or MSI-X "virtio0-input.0", "virtio0-output.0", ...) took
// on every CPU since boot.
func (g *Guest) NICInterrupts(ctx context.Context) (uint64, error) {
	out, err := g.output(ctx, guestIRQScript)
	if err != nil {
		return 0, err
	}
	return parseNICInterrupts(out)
}

// parseNICInterrupts sums the per-CPU counts of the lines naming the device
// on the first line of out, in the /proc/interrupts text that follows it.
func parseNICInterrupts(out string) (uint64, error) {
	lines := strings.Split(strings.ReplaceAll(out, "\r", ""), "\n")
	dev := strings.TrimSpace(lines[0])
	if dev == "" || strings.ContainsAny(dev, " /") || len(lines) < 3 {
		return 0, fmt.Errorf("guest interrupts: want a device name then /proc/interrupts, got %q", lines[0])
	}
	cpus := 0
	for _, f := range strings.Fields(lines[1]) {
		if strings.HasPrefix(f, "CPU") {
			cpus++
		}
	}
	if cpus == 0 {
		return 0, fmt.Errorf("guest interrupts: no CPU header in %q", lines[1])
	}
	var total uint64
	found := false
	for _, l := range lines[2:] {
		f := strings.Fields(l)
		if len(f) < cpus+2 || !strings.HasSuffix(f[0], ":") {
			continue
		}
		name := f[len(f)-1]
		if name != dev && !strings.HasPrefix(name, dev+"-") {
			continue
		}
		for _, c := range f[1 : 1+cpus] {
			n, err := strconv.ParseUint(c, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("guest interrupts: %s: count %q: %w", f[0], c, err)
			}
			total += n
		}
		found = true
	}
	if !found {
		return 0, fmt.Errorf("guest interrupts: no line for %s", dev)
	}
	return total, nil
}

// guestIRQs reads the NIC interrupts of p's guest; ok is false for a row
// without a guest or when they could not be read (the run's figure is then
// NaN, never a guess).
func guestIRQs(ctx context.Context, o Options, p Path) (n uint64, ok bool) {
	if p.Guest == nil {
		return 0, false
	}
	n, err := p.Guest.NICInterrupts(ctx)
	if err != nil {
		o.progress("%s: guest interrupts not counted: %v", p.Name, err)
		return 0, false
	}
	return n, true
}

// irqDelta is after - before, ok only when both reads worked and the count
// did not go back (a rebooted guest).
func irqDelta(before, after uint64, okBefore, okAfter bool) (uint64, bool) {
	if !okBefore || !okAfter || after < before {
		return 0, false
	}
	return after - before, true
}

// writeGuestIRQs prints a host CPU row's guest NIC interrupts and what each
// cost the processes whose CPU the row splits out (medians over medians).
func writeGuestIRQs(w io.Writer, hc *HostCPU) {
	if hc.IRQPerMB == (Summary{}) && hc.IRQPerMBRev == (Summary{}) && hc.IRQPerTxn == (Summary{}) {
		return
	}
	fmt.Fprintf(w, "  guest NIC interrupts (read in the guest): %s per MB to the guest, %s per MB from it, %s per transaction\n",
		spread(hc.IRQPerMB, "%.1f"), spread(hc.IRQPerMBRev, "%.1f"), spread(hc.IRQPerTxn, "%.2f"))
	per := func(cpu, irq Summary, scale float64) string { // µs of the part per guest interrupt
		if cpu == (Summary{}) || irq.Median <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f", cpu.Median*scale/irq.Median)
	}
	for _, part := range hc.Parts {
		fmt.Fprintf(w, "  %s CPU per guest interrupt: %s µs to the guest, %s from it, %s in RR\n", part.Name,
			per(part.NsPerByte, hc.IRQPerMB, 1e3), per(part.NsPerByteRev, hc.IRQPerMBRev, 1e3), per(part.UsPerTxn, hc.IRQPerTxn, 1))
	}
}
