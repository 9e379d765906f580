/*
 * Confines Mooncake's own listeners to one address (kvpool/confine.py loads this with
 * LD_PRELOAD).
 *
 * Mooncake 0.3.13's transfer engine binds its ports to every interface, whatever the
 * member's local hostname says. This library interposes bind(): a bind to the wildcard
 * address (0.0.0.0 or ::) made from code inside a Mooncake library (a shared object whose
 * path contains "mooncake", found with dladdr on the caller's return address) is bound to
 * KVSERVE_POOL_CONFINE_ADDR (an IPv4 address; an IPv6 socket gets its v4-mapped form)
 * instead. Every other bind, by anyone else or to a specific address, passes through
 * unchanged, as does every bind when the variable is unset or not an IPv4 address. A
 * rewritten bind that fails fails (it never falls back to the wildcard).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

static bind_fn real_bind;
static struct in_addr target;
static int have_target;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void) {
    real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    const char *addr = getenv("KVSERVE_POOL_CONFINE_ADDR");
    have_target = addr != NULL && inet_pton(AF_INET, addr, &target) == 1;
}

static int from_mooncake(const void *caller) {
    Dl_info info;
    return dladdr(caller, &info) != 0 && info.dli_fname != NULL &&
           strstr(info.dli_fname, "mooncake") != NULL;
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
