/*
 * Peer rules of the confinement library (confine.c): which peers a filtered listener keeps.
 *
 * parse_rules reads a rule list (KVSERVE_CONFINE_PEERS's syntax, in confine.c's header);
 * peer_allowed says whether one of its rules allows the peer of a connected TCP socket. A
 * uid rule needs the peer socket's owner: asked of the kernel by sock_diag (one exact
 * lookup of the connection's two ends in this network namespace), or, where netlink cannot
 * be used (or KVSERVE_CONFINE_LOOKUP=proc says so: the tests of that path), found in
 * /proc/net/tcp and tcp6 (a scan of every socket: about 10 ms with 260 sockets here).
 */
#ifndef KVSERVE_CONFINE_PEERS_H
#define KVSERVE_CONFINE_PEERS_H

#include <stdint.h>
#include <sys/types.h>

#define MAX_RULES 64

/* KVSERVE_CONFINE_PEERS, parsed: the users and IPv4 networks (host order) allowed. */
struct peer_rules {
    int active;     /* the variable is set and not empty: filter */
    int refuse_all; /* it did not parse: every peer is refused */
    int n_uids, n_nets;
    uid_t uids[MAX_RULES];
    uint32_t nets[MAX_RULES], masks[MAX_RULES];
};

/* Parse text (NULL or empty: inactive) into r. */
__attribute__((visibility("hidden"))) void parse_rules(const char *text, struct peer_rules *r);

/* Whether a rule of r allows the peer of connected socket fd. */
__attribute__((visibility("hidden"))) int peer_allowed(const struct peer_rules *r, int fd);

#endif
