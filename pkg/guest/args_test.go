package guest

import (
	"strings"
	"testing"
	"time"
)

func base() Config { return Config{Kernel: "/k", Initrd: "/i"} }

// argAfter returns the value following flag at its n-th (0-based) occurrence.
func argAfter(t *testing.T, args []string, flag string, n int) string {
	t.Helper()
	for i := 0; i < len(args)-1; i++ {
		if args[i] == flag {
			if n == 0 {
				return args[i+1]
			}
			n--
		}
	}
	t.Fatalf("%s #%d not in %q", flag, n, args)
	return ""
}

func TestKernelCmdline(t *testing.T) {
	c := base()
	c.IP, c.Gateway, c.MAC, c.Queues, c.MTU = "10.244.2.50/32", "169.254.1.1", "52:54:00:AA:BB:CC", 4, 9000
	c.CmdTimeout, c.VhostSocket = 1500*time.Millisecond, "/s"
	got, err := KernelCmdline(c)
	if err != nil {
		t.Fatal(err)
	}
	want := "console=ttyS0 quiet lk.ip=10.244.2.50/32 lk.gw=169.254.1.1 lk.mac=52:54:00:aa:bb:cc lk.queues=4 lk.mtu=9000 lk.cmdtimeout=2 panic=-1"
	if got != want {
		t.Fatalf("cmdline\n got %q\nwant %q", got, want)
	}
	got, err = KernelCmdline(base())
	if err != nil {
		t.Fatal(err)
	}
	if got != "console=ttyS0 quiet panic=-1" {
		t.Fatalf("no-network cmdline %q", got)
	}
}

// TestKernelCmdlineIPv6: a dual-stack guest gets lk.ip6/lk.gw6 beside its
// IPv4 keys; an IPv6-only one only those (and its MAC).
func TestKernelCmdlineIPv6(t *testing.T) {
	c := base()
	c.IP, c.Gateway, c.IP6, c.Gateway6, c.VhostSocket = "10.244.2.50/32", "169.254.1.1", "fd00:10:244:2::5/128", "fe80::1", "/s"
	got, err := KernelCmdline(c)
	if err != nil {
		t.Fatal(err)
	}
	want := "console=ttyS0 quiet lk.ip=10.244.2.50/32 lk.gw=169.254.1.1 lk.ip6=fd00:10:244:2::5/128 lk.gw6=fe80::1 lk.mac=" + DefaultMAC + " panic=-1"
	if got != want {
		t.Fatalf("cmdline\n got %q\nwant %q", got, want)
	}
	c.IP, c.Gateway = "", ""
	if got, err = KernelCmdline(c); err != nil || got != "console=ttyS0 quiet lk.ip6=fd00:10:244:2::5/128 lk.gw6=fe80::1 lk.mac="+DefaultMAC+" panic=-1" {
		t.Fatalf("IPv6-only cmdline %q %v", got, err)
	}
}

func TestQEMUArgsVhostUser(t *testing.T) {
	c := base()
	c.IP, c.Gateway, c.VhostSocket, c.Queues = "10.244.2.50/32", "169.254.1.1", "/run/lk/vm0.sock", 2
	c.SerialSocket = "/tmp/s.sock"
	a, err := QEMUArgs(c)
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(a, " ")
	for _, want := range []string{
		"qemu-system-x86_64 -machine q35 -cpu max -accel tcg -m 256 ",
		"-nographic -no-reboot ",
		"-kernel /k -initrd /i ",
		"-object memory-backend-memfd,id=mem,size=256M,share=on -numa node,memdev=mem",
		"-chardev socket,id=c0,path=/run/lk/vm0.sock",
		"-netdev vhost-user,id=n0,chardev=c0,queues=2",
		"-device virtio-net-pci,netdev=n0,mac=" + DefaultMAC + ",vectors=0,romfile=,mq=on",
		"-chardev socket,id=ser0,path=/tmp/s.sock,server=on,wait=on -serial chardev:ser0",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("args lack %q:\n%s", want, joined)
		}
	}
	if got := argAfter(t, a, "-append", 0); got != "console=ttyS0 quiet lk.ip=10.244.2.50/32 lk.gw=169.254.1.1 lk.mac="+DefaultMAC+" lk.queues=2 panic=-1" {
		t.Errorf("append %q", got)
	}
	if strings.Contains(joined, "-nic none") {
		t.Errorf("vhost-user args carry -nic none")
	}
	if strings.Contains(joined, "logfile") {
		t.Errorf("a console log without SerialLog: %s", joined)
	}
	c.SerialLog = "/tmp/console.log"
	if a, err = QEMUArgs(c); err != nil || !strings.Contains(strings.Join(a, " "),
		"-chardev socket,id=ser0,path=/tmp/s.sock,server=on,wait=on,logfile=/tmp/console.log,logappend=on -serial chardev:ser0") {
		t.Errorf("SerialLog: %v %v", err, a)
	}
	c.SerialLog = ""
	if strings.Contains(joined, "reconnect") {
		t.Errorf("reconnect without VhostReconnect: %s", joined)
	}
	c.VhostReconnect = 1
	if a, err = QEMUArgs(c); err != nil || !strings.Contains(strings.Join(a, " "), "-chardev socket,id=c0,path=/run/lk/vm0.sock,reconnect=1 ") {
		t.Errorf("VhostReconnect 1: %v %v", err, a)
	}
}

func TestQEMUArgsSingleQueueNoMQ(t *testing.T) {
	c := base()
	c.VhostSocket = "/s"
	a, err := QEMUArgs(c)
	if err != nil {
		t.Fatal(err)
	}
	dev := argAfter(t, a, "-device", 0)
	if strings.Contains(dev, "mq=on") || !strings.Contains(dev, "vectors=0") {
		t.Fatalf("single-queue device %q", dev)
	}
	if got := argAfter(t, a, "-serial", 0); got != "stdio" {
		t.Fatalf("serial without socket = %q, want stdio", got)
	}
}

func TestQEMUArgsNoNICAndUserNet(t *testing.T) {
	a, err := QEMUArgs(base())
	if err != nil {
		t.Fatal(err)
	}
	if got := argAfter(t, a, "-nic", 0); got != "none" {
		t.Fatalf("-nic %q", got)
	}
	if strings.Contains(strings.Join(a, " "), "memory-backend") {
		t.Fatal("no-nic guest gets a shared memory backend")
	}
	c := base()
	c.IP, c.Gateway, c.MemoryMB = "10.0.2.15/32", "10.0.2.2", 128
	c.UserNet = &UserNet{Forwards: map[int]int{40080: 80, 38080: 8080}}
	a, err = QEMUArgs(c)
	if err != nil {
		t.Fatal(err)
	}
	if got := argAfter(t, a, "-netdev", 0); got != "user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:38080-:8080,hostfwd=tcp:127.0.0.1:40080-:80" {
		t.Fatalf("user netdev %q", got)
	}
	if got := argAfter(t, a, "-m", 0); got != "128" {
		t.Fatalf("-m %q", got)
	}
}

func TestQEMUArgsTap(t *testing.T) {
	c := base()
	c.IP, c.Gateway, c.Tap, c.MAC = "10.245.2.200/24", "10.245.2.1", "lk-tap0", "52:54:00:4C:53:02"
	a, err := QEMUArgs(c)
	if err != nil {
		t.Fatal(err)
	}
	if got := argAfter(t, a, "-netdev", 0); got != "tap,id=n0,ifname=lk-tap0,script=no,downscript=no,vhost=off" {
		t.Fatalf("tap netdev %q", got)
	}
	if got := argAfter(t, a, "-device", 0); got != "virtio-net-pci,netdev=n0,mac=52:54:00:4c:53:02,vectors=0,romfile=" {
		t.Fatalf("tap device %q", got)
	}
	if strings.Contains(strings.Join(a, " "), "memory-backend") {
		t.Fatal("tap guest gets a shared memory backend")
	}
	if !strings.Contains(argAfter(t, a, "-append", 0), "lk.ip=10.245.2.200/24 lk.gw=10.245.2.1") {
		t.Fatalf("append %q", argAfter(t, a, "-append", 0))
	}
}

func TestConfigRejects(t *testing.T) {
	cases := map[string]func(*Config){
		"no kernel":        func(c *Config) { c.Kernel = "" },
		"bad ip":           func(c *Config) { c.IP, c.VhostSocket = "10.1.2.3", "/s" },
		"v6 ip":            func(c *Config) { c.IP, c.VhostSocket = "fd00::1/128", "/s" },
		"gw without ip":    func(c *Config) { c.Gateway = "169.254.1.1" },
		"v4 ip6":           func(c *Config) { c.IP6, c.VhostSocket = "10.1.2.3/32", "/s" },
		"ip6 without plen": func(c *Config) { c.IP6, c.VhostSocket = "fd00::1", "/s" },
		"gw6 without ip6":  func(c *Config) { c.Gateway6, c.VhostSocket = "fe80::1", "/s" },
		"v4 gw6":           func(c *Config) { c.IP6, c.Gateway6, c.VhostSocket = "fd00::1/128", "169.254.1.1", "/s" },
		"ip6 without nic":  func(c *Config) { c.IP6 = "fd00::1/128" },
		"bad gw":           func(c *Config) { c.IP, c.Gateway, c.VhostSocket = "10.1.2.3/32", "x", "/s" },
		"bad mac":          func(c *Config) { c.MAC = "52:54:00" },
		"multicast mac":    func(c *Config) { c.MAC = "01:00:5e:00:00:01" },
		"too many queues":  func(c *Config) { c.Queues, c.VhostSocket = MaxQueues+1, "/s" },
		"mq without vhost": func(c *Config) { c.Queues = 2 },
		"ip without nic":   func(c *Config) { c.IP = "10.1.2.3/32" },
		"comma in socket":  func(c *Config) { c.VhostSocket = "/a,b" },
		"tiny memory":      func(c *Config) { c.MemoryMB = 16 },
		"bad mtu":          func(c *Config) { c.MTU = 20 },
		"spaced append":    func(c *Config) { c.ExtraAppend = []string{"a b"} },
		"bad forward":      func(c *Config) { c.UserNet = &UserNet{Forwards: map[int]int{0: 80}} },
		"long tap":         func(c *Config) { c.Tap = "lk-tap-much-too-long" },
		"comma in tap":     func(c *Config) { c.Tap = "lk,tap" },
		"tap and vhost":    func(c *Config) { c.Tap, c.VhostSocket = "lk-tap0", "/s" },
	}
	for name, mut := range cases {
		c := base()
		mut(&c)
		if _, err := QEMUArgs(c); err == nil {
			t.Errorf("%s: accepted", name)
		} else if !strings.HasPrefix(err.Error(), "guest config: ") {
			t.Errorf("%s: error %q lacks context", name, err)
		}
	}
}

func TestBuildScriptLookup(t *testing.T) {
	p, err := BuildScript()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(p, "/scripts/guest/build.sh") {
		t.Fatalf("BuildScript = %q", p)
	}
	t.Setenv("LANEKIT_GUEST_BUILD", "/nonexistent/build.sh")
	if _, err := BuildScript(); err == nil || !strings.Contains(err.Error(), "LANEKIT_GUEST_BUILD") {
		t.Fatalf("missing override: %v", err)
	}
	if _, _, err := EnsureImage(t.TempDir()); err == nil {
		t.Fatal("EnsureImage with a missing build script succeeded")
	}
}

func TestStartRejectsMissingImage(t *testing.T) {
	c := Config{QEMU: "true", Kernel: "/nonexistent/vmlinuz", Initrd: "/nonexistent/initrd"}
	if _, err := Start(t.Context(), c); err == nil || !strings.HasPrefix(err.Error(), "start guest: ") {
		t.Fatalf("Start with a missing kernel: %v", err)
	}
}
