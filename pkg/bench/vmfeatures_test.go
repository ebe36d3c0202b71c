package bench

import "testing"

func TestAckedOffloads(t *testing.T) {
	scrape := `# TYPE lanekit_vhost_virtio_features gauge
lanekit_vhost_virtio_features{vm="vm1",set="offered",bit="56"} 1
lanekit_vhost_virtio_features{vm="vm1",set="offered",bit="0"} 1
lanekit_vhost_virtio_features{vm="vm1",set="acked",bit="0"} 1
lanekit_vhost_virtio_features{vm="vm1",set="acked",bit="1"} 1
lanekit_vhost_virtio_features{vm="vm1",set="acked",bit="11"} 1
lanekit_vhost_virtio_features{vm="vm1",set="acked",bit="32"} 1
lanekit_vhost_rx_packets_total{vm="vm1",queue="0"} 5
`
	got, err := ackedOffloads(scrape)
	if err != nil || got != "csum guest_csum host_tso4" {
		t.Fatalf("got %q, %v", got, err)
	}
	if got, err := ackedOffloads(`lanekit_vhost_virtio_features{vm="v",set="acked",bit="32"} 1`); err != nil || got != "none" {
		t.Fatalf("no offloads: got %q, %v", got, err)
	}
	if _, err := ackedOffloads(`lanekit_vhost_rx_packets_total{vm="v",queue="0"} 1`); err == nil {
		t.Fatal("a scrape without features must be an error")
	}
}
