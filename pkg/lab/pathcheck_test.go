package lab

import "testing"

func TestSNMPValue(t *testing.T) {
	snmp := "Ip: Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams\n" +
		"Ip: 1 64 1000 0 0 172595\n" +
		"Icmp: InMsgs InErrors\nIcmp: 3 0\n"
	if v, err := snmpValue(snmp, "Ip", "ForwDatagrams"); err != nil || v != 172595 {
		t.Errorf("ForwDatagrams = %d, %v; want 172595", v, err)
	}
	if _, err := snmpValue(snmp, "Ip", "NoSuchField"); err == nil {
		t.Error("a missing field must be an error")
	}
	if _, err := snmpValue("", "Ip", "ForwDatagrams"); err == nil {
		t.Error("empty snmp must be an error")
	}
}

func TestParseLinkPackets(t *testing.T) {
	js := `[{"ifname":"eth0","stats64":{"rx":{"bytes":9,"packets":12},"tx":{"bytes":7,"packets":34}}}]`
	tx, rx, err := parseLinkPackets(js)
	if err != nil || tx != 34 || rx != 12 {
		t.Errorf("tx %d rx %d, %v; want 34 12", tx, rx, err)
	}
	if _, _, err := parseLinkPackets(`[]`); err == nil {
		t.Error("no link must be an error")
	}
}
