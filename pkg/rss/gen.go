package rss

//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror" rsshash ../../bpf/rss_hash.c -- -I../../bpf -I/usr/include/x86_64-linux-gnu
//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror" tunsteer ../../bpf/tun_steer.c -- -I../../bpf -I/usr/include/x86_64-linux-gnu
