/*
 * Confines Mooncake's own listeners to one address, and to the peers allowed to use them
 * (kvpool/confine.py loads this with LD_PRELOAD).
 *
 * Only calls made from code inside a Mooncake library (a shared object whose path contains
 * "mooncake", found with dladdr on the caller's return address) are touched; every other
 * call in the process passes through unchanged.
 *
 * bind(): Mooncake 0.3.13's transfer engine binds its ports to every interface, whatever
 * the member's local hostname says. A bind to the wildcard address (0.0.0.0 or ::) is bound
 * to KVSERVE_POOL_CONFINE_ADDR (an IPv4 address; an IPv6 socket gets its v4-mapped form)
 * instead. A bind to a specific address passes, as does every bind when the variable is
 * unset or not an IPv4 address. A rewritten bind that fails fails (it never falls back to
 * the wildcard).
 *
 * accept() and accept4(): the transfer engine serves any peer that connects (its data port
 * writes and reads any registered memory, its handshake port aborts the process on a
 * malformed message). KVSERVE_CONFINE_PEERS, when set and not empty, is a comma-separated list
 * of rules; a connection is kept when one rule matches its peer and closed otherwise:
 *   uid:N        the peer's socket is in this network namespace (listed in /proc/net/tcp
 *                or tcp6) and owned by user N (a local peer of that account);
 *   A.B.C.D/P    the peer's IPv4 address (or its v4-mapped IPv6 form) is in that network
 *                (A.B.C.D alone: that address).
 * A refused connection is closed and the next one is accepted in its place (on a
 * non-blocking listener: EAGAIN when none is waiting, which the caller's event loop takes
 * as "wait"). A rule list that does not parse refuses every peer. Unset or empty: every
 * peer is kept. With KVSERVE_CONFINE_EVERY_CALLER=1 the rules apply to every accept of the
 * process, whoever calls it (a pool service: the master, or the Python metadata server).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdint.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_RULES 64

/* KVSERVE_CONFINE_PEERS, parsed: the users and IPv4 networks (host order) allowed. */
struct peer_rules {
    int active;     /* the variable is set and not empty: filter */
    int refuse_all; /* it did not parse: every peer is refused */
    int n_uids, n_nets;
    uid_t uids[MAX_RULES];
    uint32_t nets[MAX_RULES], masks[MAX_RULES];
};

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

static void parse_rules(const char *text, struct peer_rules *r) {
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

/* The owner of the socket at peer:peer_port connected to self:self_port, when it is in
 * this network namespace; 1 when found. */
static int local_owner(const unsigned char peer[16], unsigned peer_port,
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

/* Whether a rule of r allows the peer of connected socket fd. */
static int peer_allowed(const struct peer_rules *r, int fd) {
    struct sockaddr_storage ps, ls;
    socklen_t pl = sizeof ps, ll = sizeof ls;
    unsigned char peer[16], self[16];
    unsigned peer_port, self_port;
    if (r->refuse_all || getpeername(fd, (struct sockaddr *)&ps, &pl) != 0 ||
        getsockname(fd, (struct sockaddr *)&ls, &ll) != 0 ||
        !endpoint(&ps, peer, &peer_port) || !endpoint(&ls, self, &self_port))
        return 0;
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (memcmp(peer, mapped, 12) == 0) {
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

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);
typedef int (*accept4_fn)(int, struct sockaddr *, socklen_t *, int);

static bind_fn real_bind;
static accept4_fn real_accept4;
static struct in_addr target;
static int have_target;
static struct peer_rules rules;
static int every_caller;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void) {
    real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    real_accept4 = (accept4_fn)dlsym(RTLD_NEXT, "accept4");
    const char *addr = getenv("KVSERVE_POOL_CONFINE_ADDR");
    have_target = addr != NULL && inet_pton(AF_INET, addr, &target) == 1;
    parse_rules(getenv("KVSERVE_CONFINE_PEERS"), &rules);
    const char *every = getenv("KVSERVE_CONFINE_EVERY_CALLER");
    every_caller = every != NULL && strcmp(every, "1") == 0;
}

static int from_mooncake(const void *caller) {
    Dl_info info;
    return dladdr(caller, &info) != 0 && info.dli_fname != NULL &&
           strstr(info.dli_fname, "mooncake") != NULL;
}

/* Whether an accept called from caller is filtered. */
static int filtered(const void *caller) {
    return rules.active && (every_caller || from_mooncake(caller));
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    pthread_once(&once, init);
    const void *caller = __builtin_return_address(0);
    if (!have_target || addr == NULL || !from_mooncake(caller)) {
        return real_bind(fd, addr, len);
    }
    if (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in v4;
        memcpy(&v4, addr, sizeof v4);
        if (v4.sin_addr.s_addr == htonl(INADDR_ANY)) {
            v4.sin_addr = target;
            return real_bind(fd, (const struct sockaddr *)&v4, sizeof v4);
        }
    } else if (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 v6;
        memcpy(&v6, addr, sizeof v6);
        if (IN6_IS_ADDR_UNSPECIFIED(&v6.sin6_addr)) {
            memset(&v6.sin6_addr, 0, sizeof v6.sin6_addr);
            v6.sin6_addr.s6_addr[10] = 0xff;
            v6.sin6_addr.s6_addr[11] = 0xff;
            memcpy(&v6.sin6_addr.s6_addr[12], &target, 4);
            return real_bind(fd, (const struct sockaddr *)&v6, sizeof v6);
        }
    }
    return real_bind(fd, addr, len);
}

/* Accept on behalf of a filtered listener: connections whose peer no rule allows are
 * closed, and the next one is taken in their place. */
static int filtered_accept(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    for (;;) {
        int conn = real_accept4(fd, addr, len, flags);
        if (conn < 0 || peer_allowed(&rules, conn)) {
            return conn;
        }
        close(conn);
    }
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    pthread_once(&once, init);
    if (!filtered(__builtin_return_address(0))) {
        return real_accept4(fd, addr, len, flags);
    }
    return filtered_accept(fd, addr, len, flags);
}

int accept(int fd, struct sockaddr *addr, socklen_t *len) {
    pthread_once(&once, init);
    if (!filtered(__builtin_return_address(0))) {
        return real_accept4(fd, addr, len, 0);
    }
    return filtered_accept(fd, addr, len, 0);
}
