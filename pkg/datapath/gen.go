package datapath

//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror" -type lk_drop_reason -type lk_metric_kind -type lk_redirect_kind -type lk_endpoint_flags -type lk_event_kind -type lk_events_flags -type lk_event -type lk_ct_flags -type lk_ct_timeout -type lk_ct_counter -type lk_lb_stat -type lk_ct_key_flags -type lk_policy_dir -type policy_key -type policy_cidr_key -type policy_isolation -type policy_verdict -type policy_value -type lk_tunnel_stat -type tunnel_node -type tunnel_node_key -type edt_info pod ../../bpf/pod.c -- -I../../bpf -I/usr/include/x86_64-linux-gnu
//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror" uplink ../../bpf/uplink.c -- -I../../bpf -I/usr/include/x86_64-linux-gnu
//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror" vm ../../bpf/vm.c -- -I../../bpf -I/usr/include/x86_64-linux-gnu
//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror" -type lk_sock_hook -type lk_sock_stat sock ../../bpf/sock.c -- -I../../bpf -I/usr/include/x86_64-linux-gnu
