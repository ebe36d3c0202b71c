// Package guest builds and boots lanekit's test VM: a real, tiny Linux guest
// that QEMU 7.2 boots under TCG, with virtio-net on vhost-user (the lanekit
// fast lane, or DPDK's vhost PMD as a stand-in backend), a tap device (QEMU's
// userspace virtio-net: the standard path the benchmark compares with),
// user-mode networking, or no NIC at all, driven over its serial console.
//
// # API
//
//	kernel, initrd, err := guest.EnsureImage(guest.DefaultCacheDir) // build or reuse
//	args, err := guest.QEMUArgs(cfg)                                 // the QEMU command line
//	vm, err := guest.Start(ctx, cfg)                                 // ctx bounds the VM's lifetime
//	status, err := vm.WaitReady(ctx)                                 // "net=up if=eth0 ip=... queues=N"
//	out, exit, err := vm.Run(ctx, "uname -r")
//	vm.Stop()                                                        // kill the process group, reap, rm temp dir
//
// QEMU runs in its own process group with PR_SET_PDEATHSIG=SIGKILL, so it dies
// with the process that started it even when Stop is never reached.
//
// # Image
//
// scripts/guest/build.sh (run by EnsureImage; it apt-installs busybox-static,
// cpio, ethtool, kmod, xz-utils and zstd when missing) fills the cache dir,
// /var/cache/lanekit/guest by default:
//
//	debs/                      linux-image-cloud-amd64 and its linux-image-<kver> (apt-get download)
//	kernel/<kver>/             dpkg-deb -x of the image package (never installed into /boot)
//	kernel.version             <kver> in use; build.sh --refresh re-resolves it
//	vmlinuz                    the kernel QEMU boots
//	initrd.img                 gzip'd cpio (newc), ~2.7 MiB
//	initrd.stamp               hash of every input: a rebuild happens only when one changes
//
// The initramfs holds /init (scripts/guest/init), busybox-static with an applet
// symlink per command in /bin, ethtool with its shared libraries (busybox has
// none; used for lk.queues), the benchmark servers `lanekit lab bench` starts
// in guests (iperf3 and sockperf with their shared libraries, and lk-bench: the
// harness's connection-rate tool from pkg/bench/cmd/lk-bench, built static with
// CGO_ENABLED=0 by build.sh from the checkout), /bin/lk-responder, /www/index.html, and
// /lib/modules/lk/NN-<name>.ko: virtio_ring, virtio, virtio_pci_legacy_dev,
// virtio_pci_modern_dev, virtio_pci, failover, net_failover, virtio_net,
// decompressed if Debian ships them compressed, loaded by busybox insmod in
// that order (the list is /etc/lk-modules).
//
// # Kernel command line
//
// KernelCmdline renders "console=ttyS0 quiet [lk.* keys] panic=-1"; with
// -no-reboot a dying init ends QEMU. Keys read by /init:
//
//	lk.ip=10.244.2.50/32   NIC address; absent: no network setup ("LK-READY net=none")
//	lk.gw=169.254.1.1      on-link gateway: ip route add GW dev IF; ip route add default via GW
//	lk.ip6=fd00::5/128     IPv6 NIC address (no DAD, accept_ra 0); with or without lk.ip
//	lk.gw6=fe80::1         IPv6 gateway: ip -6 route add default via GW dev IF
//	lk.mac=52:54:00:..     configure the NIC with this MAC (else eth0)
//	lk.queues=N            N > 1: ethtool -L IF combined N (needs mq=on and a backend with N queue pairs)
//	lk.mtu=N               NIC MTU
//	lk.cmdtimeout=S        guest-side bound on one control command (default 120 s)
//
// The virtio-net device always has vectors=0 (no MSI-X): QEMU 7.2 under TCG
// crashes with vhost-user otherwise, and the guest then uses INTx.
//
// # Serial control protocol (ttyS0, lines ending in "\n"; the guest adds "\r")
//
//	guest: LK-READY net=up if=eth0 ip=10.244.2.50/32 queues=1   once, after network setup
//	       LK-READY net=none                                  no lk.ip
//	       LK-FAIL <reason>                                   setup failed; the loop still runs
//	host:  LKCMD <id> <shell command>                          one line, < 3000 bytes
//	guest: LKBEGIN <id>
//	       <stdout and stderr of sh -c, stdin /dev/null>
//	       "\n" LKOUT <id> <exit code>
//	host:  LKPING <id>                                        while a command is quiet (every 10 s)
//	guest: LKPONG <id>                                        answered between commands
//	guest: LKERR unknown line                                 any other non-empty line
//
// The extra "\n" before LKOUT ends unterminated output; Run removes it again,
// so the output comes back as written. Commands run one at a time. A pong (or
// the next LKBEGIN) before a command's LKOUT means its result line was lost:
// Run returns ErrResultLost instead of waiting out its context. The ping also
// writes to the tty, which restarts output that stalled under load. Kernel
// messages are kept off the console (printk level 1) and the tty does not echo.
// The ready marker is searched anywhere in a line (SeaBIOS escapes precede it).
//
// # In the guest for tests
//
// TCP 8080: busybox nc -ll -e lk-responder: "LK-HELLO lk-guest\n", then echo.
// TCP 80: busybox httpd serving "lanekit guest\n". busybox ping, ip, arp, nc, wget.
//
// # Boot time
//
// QEMU start to LK-READY under TCG (-cpu max, 1 vCPU, 256 MiB) on this 2-core
// machine while other builds and tests ran: 2.9-8.0 s with no NIC, 4.7-5.9 s
// with user-mode networking, 9.7-11.1 s with vhost-user while dpdk-testpmd
// busy-polls one of the two cores. The tests print it (go test -v).
package guest
