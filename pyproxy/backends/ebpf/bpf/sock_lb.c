// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* pyproxy's socket-level service balancing: cgroup programs that connect a socket to one of
 * a service's endpoints instead of its address (connect, and each datagram of an unconnected
 * UDP socket), and make replies and getpeername() show the service address again.
 *
 * Written for pyproxy from the kernel's documented interfaces (include/uapi/linux/bpf.h);
 * the design follows Cilium's socket LB (bpf/bpf_sock.c), whose code is not copied.
 *
 * Addresses are 16 bytes everywhere: an IPv4 address is stored IPv4-mapped (::ffff:a.b.c.d),
 * so one map serves both families and a dual-stack socket's mapped address finds the same
 * entry. Ports are in network order, as the socket context holds them.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ECONNREFUSED 111
#define AFFINITY 1

struct svc_key {
	__u32 addr[4];
	__u16 port;
	__u8 proto;
	__u8 pad;
	__u32 slot; /* 0: the service's head entry; 1..count: its endpoints */
};

struct svc_value {
	__u32 addr[4];	   /* endpoint (slots 1..count) */
	__u16 port;	   /* endpoint's port, network order */
	__u16 flags;	   /* head: AFFINITY */
	__u32 count;	   /* head: how many endpoints; 0: refuse */
	__u32 timeout;	   /* head: affinity timeout, seconds */
	__u32 id;	   /* head: the service port's id (affinity key) */
};

struct rev_key {
	__u64 cookie; /* the socket's */
	__u32 addr[4];
	__u16 port;
	__u16 pad;
	__u32 pad2;
};

struct rev_value {
	__u32 addr[4];
	__u16 port;
	__u16 pad;
};

struct aff_key {
	__u64 netns; /* the client's network namespace cookie */
	__u32 id;
	__u32 pad;
};

struct aff_value {
	__u32 addr[4];
	__u16 port;
	__u16 pad;
	__u32 pad2;
	__u64 used; /* ns, bpf_ktime_get_ns */
};

/* An endpoint of a service with affinity: whether a remembered endpoint still is one. */
struct member_key {
	__u32 vip[4];
	__u16 vport;
	__u8 proto;
	__u8 pad;
	__u32 addr[4];
	__u16 port;
	__u16 pad2;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1 << 20);
	__type(key, struct svc_key);
	__type(value, struct svc_value);
} services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1 << 20);
	__type(key, struct member_key);
	__type(value, __u32);
} members SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 18);
	__type(key, struct rev_key);
	__type(value, struct rev_value);
} reverse SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 18);
	__type(key, struct aff_key);
	__type(value, struct aff_value);
} affinity SEC(".maps");

/* Per service port (its head's id): sockets sent to an endpoint (TCP: connections; UDP:
 * datagrams), counted per CPU without atomics; pyproxy sums the CPUs when scraped. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(max_entries, 1 << 16);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

static __always_inline void count(__u32 id)
{
	__u64 one = 1, *n = bpf_map_lookup_elem(&counts, &id);

	if (n)
		*n += 1;
	else
		bpf_map_update_elem(&counts, &id, &one, BPF_NOEXIST);
}

/* The endpoint for a client of the service whose head is ``head``, into addr and port: the
 * remembered one under affinity while it is still one of the service's (``members``), else
 * one at random. 0, or -1 when the slot drawn is missing (a write in progress). */
static __always_inline int pick(struct bpf_sock_addr *ctx, struct svc_key *key,
				struct svc_value *head, __u32 *addr, __u16 *port)
{
	struct aff_key ak = {};
	struct aff_value *remembered;
	struct svc_value *ep;
	__u64 now = 0;

	if (head->flags & AFFINITY) {
		ak.netns = bpf_get_netns_cookie(ctx);
		ak.id = head->id;
		now = bpf_ktime_get_ns();
		remembered = bpf_map_lookup_elem(&affinity, &ak);
		if (remembered && now - remembered->used <= (__u64)head->timeout * 1000000000ULL) {
			struct member_key mk = {};
			__builtin_memcpy(mk.vip, key->addr, sizeof(mk.vip));
			mk.vport = key->port;
			mk.proto = key->proto;
			__builtin_memcpy(mk.addr, remembered->addr, sizeof(mk.addr));
			mk.port = remembered->port;
			if (bpf_map_lookup_elem(&members, &mk)) {
				remembered->used = now;
				__builtin_memcpy(addr, remembered->addr, 16);
				*port = remembered->port;
				return 0;
			}
		}
	}
	/* TCP: each connection draws; UDP: one socket keeps one endpoint, as one conntrack flow
	 * keeps one through the rules (a datagram each would scatter a client's requests) */
	if (ctx->protocol == IPPROTO_UDP)
		key->slot = (__u32)(bpf_get_socket_cookie(ctx) % head->count) + 1;
	else
		key->slot = (bpf_get_prandom_u32() % head->count) + 1;
	ep = bpf_map_lookup_elem(&services, key);
	if (!ep)
		return -1;
	__builtin_memcpy(addr, ep->addr, 16);
	*port = ep->port;
	if (head->flags & AFFINITY) {
		struct aff_value av = {};
		__builtin_memcpy(av.addr, ep->addr, sizeof(av.addr));
		av.port = ep->port;
		av.used = now;
		bpf_map_update_elem(&affinity, &ak, &av, BPF_ANY);
	}
	return 0;
}

static __always_inline void remember(struct bpf_sock_addr *ctx, const __u32 *addr, __u16 port,
				     const __u32 *vip, __u16 vport)
{
	struct rev_key rk = {};
	struct rev_value rv = {};

	rk.cookie = bpf_get_socket_cookie(ctx);
	__builtin_memcpy(rk.addr, addr, sizeof(rk.addr));
	rk.port = port;
	__builtin_memcpy(rv.addr, vip, sizeof(rv.addr));
	rv.port = vport;
	bpf_map_update_elem(&reverse, &rk, &rv, BPF_ANY);
}

/* Point the socket's address at ``addr`` (16 bytes, IPv4-mapped for an IPv4 socket). */
static __always_inline void write_addr(struct bpf_sock_addr *ctx, const __u32 *addr, int v4)
{
	if (v4) {
		ctx->user_ip4 = addr[3];
	} else {
		ctx->user_ip6[0] = addr[0];
		ctx->user_ip6[1] = addr[1];
		ctx->user_ip6[2] = addr[2];
		ctx->user_ip6[3] = addr[3];
	}
}

/* 1: proceed (translated or not ours); 0: refused (ECONNREFUSED, as kube-proxy's REJECT).
 * A UDP socket being connected is left to the rules: it would stay connected to an endpoint
 * after the endpoint is gone, where the rules' conntrack entry is deleted with it (and the
 * next datagram goes to another endpoint). Unconnected UDP is translated per sendmsg. */
static __always_inline int translate(struct bpf_sock_addr *ctx, __u32 *vip, int v4, int connect)
{
	struct svc_key key = {};
	struct svc_value *head;
	__u32 addr[4];
	__u16 port;
	__u16 vport = (__u16)ctx->user_port;
	__u32 id;

	if (ctx->protocol != IPPROTO_TCP && ctx->protocol != IPPROTO_UDP)
		return 1;
	if (connect && ctx->protocol == IPPROTO_UDP)
		return 1;
	__builtin_memcpy(key.addr, vip, sizeof(key.addr));
	key.port = vport;
	key.proto = ctx->protocol;
	head = bpf_map_lookup_elem(&services, &key);
	if (!head)
		return 1;
	if (head->count == 0) {
		bpf_set_retval(-ECONNREFUSED);
		return 0;
	}
	id = head->id;
	if (pick(ctx, &key, head, addr, &port) < 0)
		return 1;
	if (v4 && (addr[0] || addr[1] || addr[2] != bpf_htonl(0xffff)))
		return 1; /* an IPv6 endpoint for an IPv4 socket: leave it to the rules */
	write_addr(ctx, addr, v4);
	ctx->user_port = port;
	/* getpeername() of a TCP socket and replies to a UDP one show the service again, as
	 * they do through kube-proxy's DNAT */
	remember(ctx, addr, port, vip, vport);
	count(id);
	return 1;
}

/* Replies and getpeername(): the endpoint's address back to the service's. */
static __always_inline void untranslate(struct bpf_sock_addr *ctx, __u32 *addr, int v4)
{
	struct rev_key rk = {};
	struct rev_value *rv;

	rk.cookie = bpf_get_socket_cookie(ctx);
	__builtin_memcpy(rk.addr, addr, sizeof(rk.addr));
	rk.port = (__u16)ctx->user_port;
	rv = bpf_map_lookup_elem(&reverse, &rk);
	if (!rv)
		return;
	write_addr(ctx, rv->addr, v4);
	ctx->user_port = rv->port;
}

/* The address the socket names, IPv4-mapped for an IPv4 socket. */
static __always_inline void read_addr(__u32 *addr, struct bpf_sock_addr *ctx, int v4)
{
	if (v4) {
		addr[0] = 0;
		addr[1] = 0;
		addr[2] = bpf_htonl(0xffff);
		addr[3] = ctx->user_ip4;
	} else {
		addr[0] = ctx->user_ip6[0];
		addr[1] = ctx->user_ip6[1];
		addr[2] = ctx->user_ip6[2];
		addr[3] = ctx->user_ip6[3];
	}
}

/* One entry point per hook and family: the hook's section name is its attach type. */
#define FORWARD(hook, v4, connect)                                  \
	SEC("cgroup/" #hook)                                          \
	int hook(struct bpf_sock_addr *ctx)                           \
	{                                                             \
		__u32 addr[4];                                        \
		read_addr(addr, ctx, v4);                             \
		return translate(ctx, addr, v4, connect);             \
	}
#define REVERSE(hook, v4)                                           \
	SEC("cgroup/" #hook)                                          \
	int hook(struct bpf_sock_addr *ctx)                           \
	{                                                             \
		__u32 addr[4];                                        \
		read_addr(addr, ctx, v4);                             \
		untranslate(ctx, addr, v4);                           \
		return 1;                                             \
	}

FORWARD(connect4, 1, 1)
FORWARD(sendmsg4, 1, 0)
REVERSE(recvmsg4, 1)
REVERSE(getpeername4, 1)
FORWARD(connect6, 0, 1)
FORWARD(sendmsg6, 0, 0)
REVERSE(recvmsg6, 0)
REVERSE(getpeername6, 0)

char LICENSE[] SEC("license") = "Dual BSD/GPL";
