/* Peer rules of the confinement library: see peers.h. */
#define _GNU_SOURCE
#include "peers.h"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int parse_rule(const char *rule, struct peer_rules *r) {
    char *end;
    if (strncmp(rule, "uid:", 4) == 0) {
        if (rule[4] < '0' || rule[4] > '9' || r->n_uids == MAX_RULES) return 0;
        unsigned long uid = strtoul(rule + 4, &end, 10);
        if (*end != '\0' || uid > 0xFFFFFFFEul) return 0;
        r->uids[r->n_uids++] = (uid_t)uid;
        return 1;
    }
    char host[INET_ADDRSTRLEN];
    const char *slash = strchr(rule, '/');
    size_t n = slash ? (size_t)(slash - rule) : strlen(rule);
    unsigned long prefix = 32;
    struct in_addr a;
    if (n == 0 || n >= sizeof host || r->n_nets == MAX_RULES) return 0;
    memcpy(host, rule, n);
    host[n] = '\0';
    if (inet_pton(AF_INET, host, &a) != 1) return 0;
    if (slash) {
        if (slash[1] < '0' || slash[1] > '9') return 0;
        prefix = strtoul(slash + 1, &end, 10);
        if (*end != '\0' || prefix > 32) return 0;
    }
    uint32_t mask = prefix == 0 ? 0 : 0xFFFFFFFFu << (32 - prefix);
    r->masks[r->n_nets] = mask;
    r->nets[r->n_nets++] = ntohl(a.s_addr) & mask;
    return 1;
}

void parse_rules(const char *text, struct peer_rules *r) {
    memset(r, 0, sizeof *r);
    if (text == NULL || *text == '\0') return;
    r->active = 1;
    char rule[64];
    while (*text) {
        const char *comma = strchr(text, ',');
        size_t n = comma ? (size_t)(comma - text) : strlen(text);
        if (n == 0 || n >= sizeof rule) {
            r->refuse_all = 1;
            return;
        }
        memcpy(rule, text, n);
        rule[n] = '\0';
        if (!parse_rule(rule, r)) {
            r->refuse_all = 1;
            return;
        }
        text += n + (comma != NULL);
    }
}

/* A socket address as 16 bytes (an IPv4 one in its v4-mapped form) and a port. */
static int endpoint(const struct sockaddr_storage *ss, unsigned char out[16], unsigned *port) {
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *v4 = (const struct sockaddr_in *)ss;
        memset(out, 0, 10);
        out[10] = out[11] = 0xff;
        memcpy(out + 12, &v4->sin_addr, 4);
        *port = ntohs(v4->sin_port);
        return 1;
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)ss;
        memcpy(out, &v6->sin6_addr, 16);
        *port = ntohs(v6->sin6_port);
        return 1;
    }
    return 0;
}

/* A /proc/net/tcp{,6} address (8 or 32 hex digits: 32-bit words as the kernel holds
 * them) as 16 bytes, IPv4 in its v4-mapped form. */
static int proc_address(const char *hex, unsigned char out[16]) {
    size_t n = strlen(hex);
    char word[9] = {0};
    if (n != 8 && n != 32) return 0;
    if (n == 8) {
        memset(out, 0, 10);
        out[10] = out[11] = 0xff;
    }
    for (size_t i = 0; i < n / 8; i++) {
        memcpy(word, hex + 8 * i, 8);
        uint32_t v = (uint32_t)strtoul(word, NULL, 16);
        memcpy(out + (n == 8 ? 12 : 4 * i), &v, 4);
    }
    return 1;
}

/* The owner of the socket at peer:peer_port connected to self:self_port, found in
 * /proc/net/tcp{,6}; 1 when found. */
static int proc_owner(const unsigned char peer[16], unsigned peer_port,
                       const unsigned char self[16], unsigned self_port, uid_t *uid) {
    static const char *tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    char line[512], local[33], remote[33];
    unsigned char a[16], b[16];
    unsigned lport, rport, owner;
    for (size_t t = 0; t < 2; t++) {
        FILE *f = fopen(tables[t], "re");
        if (f == NULL) continue;
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, " %*d: %32[0-9A-Fa-f]:%x %32[0-9A-Fa-f]:%x %*x %*s %*s %*s %u",
                       local, &lport, remote, &rport, &owner) != 5)
                continue;
            if (lport == peer_port && rport == self_port && proc_address(local, a) &&
                proc_address(remote, b) && memcmp(a, peer, 16) == 0 &&
                memcmp(b, self, 16) == 0) {
                fclose(f);
                *uid = (uid_t)owner;
                return 1;
            }
        }
        fclose(f);
    }
    return 0;
}

static const unsigned char MAPPED[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

/* The owner of the socket at peer:peer_port connected to self:self_port, asked of the
 * kernel: 1 found, 0 not there, -1 netlink could not be used. An IPv4 lookup first, then an
 * IPv6 one (the kernel looks a v4-mapped pair up among IPv4 sockets too). */
static int diag_owner(const unsigned char peer[16], unsigned peer_port,
                      const unsigned char self[16], unsigned self_port, uid_t *uid) {
    int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (nl < 0) return -1;
    int found = -1;
    int v4 = memcmp(peer, MAPPED, 12) == 0 && memcmp(self, MAPPED, 12) == 0;
    for (int family = v4 ? AF_INET : AF_INET6; found != 1; family = AF_INET6) {
        struct {
            struct nlmsghdr nlh;
            struct inet_diag_req_v2 req;
        } ask;
        memset(&ask, 0, sizeof ask);
        ask.nlh.nlmsg_len = sizeof ask;
        ask.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
        ask.nlh.nlmsg_flags = NLM_F_REQUEST;
        ask.req.sdiag_family = (uint8_t)family;
        ask.req.sdiag_protocol = IPPROTO_TCP;
        ask.req.idiag_states = ~0u;
        ask.req.id.idiag_sport = htons((uint16_t)peer_port); /* the peer socket's own end */
        ask.req.id.idiag_dport = htons((uint16_t)self_port);
        size_t n = family == AF_INET ? 4 : 16, at = family == AF_INET ? 12 : 0;
        memcpy(ask.req.id.idiag_src, peer + at, n);
        memcpy(ask.req.id.idiag_dst, self + at, n);
        ask.req.id.idiag_cookie[0] = ask.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
        struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
        if (sendto(nl, &ask, sizeof ask, 0, (struct sockaddr *)&kernel, sizeof kernel) < 0)
            break;
        union {
            struct nlmsghdr h;
            char bytes[4096];
        } reply;
        ssize_t got = recv(nl, &reply, sizeof reply, 0);
        if (got < 0) break;
        found = 0;
        if (NLMSG_OK(&reply.h, (size_t)got) && reply.h.nlmsg_type == SOCK_DIAG_BY_FAMILY) {
            *uid = ((struct inet_diag_msg *)NLMSG_DATA(&reply.h))->idiag_uid;
            found = 1;
        }
        if (family == AF_INET6) break;
    }
    close(nl);
    return found;
}

/* The owner of the socket at peer:peer_port connected to self:self_port in this network
 * namespace; 1 when found. */
static int local_owner(const unsigned char peer[16], unsigned peer_port,
                       const unsigned char self[16], unsigned self_port, uid_t *uid) {
    const char *how = getenv("KVSERVE_CONFINE_LOOKUP");
    int asked = how != NULL && strcmp(how, "proc") == 0
                    ? -1
                    : diag_owner(peer, peer_port, self, self_port, uid);
    return asked >= 0 ? asked : proc_owner(peer, peer_port, self, self_port, uid);
}

int peer_allowed(const struct peer_rules *r, int fd) {
    struct sockaddr_storage ps, ls;
    socklen_t pl = sizeof ps, ll = sizeof ls;
    unsigned char peer[16], self[16];
    unsigned peer_port, self_port;
    if (r->refuse_all || getpeername(fd, (struct sockaddr *)&ps, &pl) != 0 ||
        getsockname(fd, (struct sockaddr *)&ls, &ll) != 0 ||
        !endpoint(&ps, peer, &peer_port) || !endpoint(&ls, self, &self_port))
        return 0;
    if (memcmp(peer, MAPPED, 12) == 0) {
        uint32_t v4;
        memcpy(&v4, peer + 12, 4);
        v4 = ntohl(v4);
        for (int i = 0; i < r->n_nets; i++)
            if ((v4 & r->masks[i]) == r->nets[i]) return 1;
    }
    uid_t owner;
    if (r->n_uids > 0 && local_owner(peer, peer_port, self, self_port, &owner))
        for (int i = 0; i < r->n_uids; i++)
            if (r->uids[i] == owner) return 1;
    return 0;
}

