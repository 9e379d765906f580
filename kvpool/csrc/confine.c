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
 *   uid:N        the peer's socket is in this network namespace and owned by user N (a
 *                local peer of that account; peers.c asks the kernel);
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

#include "peers.h"

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
