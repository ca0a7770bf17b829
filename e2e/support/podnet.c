/*
 * podnet: a pod's network, for processes the node simulator (node.py) runs on one machine.
 *
 * Loaded with LD_PRELOAD into every container process (Python, libuv, librdkafka and the JVM
 * all call these through libc), it gives each pod what a network namespace and the cluster's
 * DNS would, without either:
 *
 * - An address of its own: each pod has a loopback address of its own (PODNET_IP, also its
 *   status.podIP). A bind to the wildcard or to 127.0.0.1 binds that address instead, so the
 *   same container port in two pods never clashes.
 * - The same for IPv6 sockets carrying IPv4 (the JVM's: ::ffff:127.0.0.1 and "::"): they bind
 *   and connect to the pod's address in its IPv4-mapped form. The machine has no other IPv6
 *   address a pod could use.
 * - Its own 127.0.0.1: a connect to 127.0.0.1:port goes to the pod's address when something
 *   listens there (a sidecar on "localhost"), else to 127.0.0.1 (the machine, where the
 *   control plane and the Kafka broker listen).
 * - Cluster DNS and Service ports: getaddrinfo answers the names of the table PODNET_HOSTS
 *   (written by the simulator from Services and pods): "<svc>.<ns>.svc" and
 *   "<pod>.<svc>.<ns>.svc", with ".cluster.local" and the pod namespace's search path. A
 *   Service's port is mapped to its endpoints' target ports there, as kube-proxy would; its
 *   ready endpoints come in a random order, one connection each.
 *
 * Table lines: "<name> <port|*> <address>...", an address being "ip" (keep the port asked
 * for) or "ip:port". The first line matching the name and the port wins, then "*".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_ADDRESSES 64
#define MAX_NAME 256

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int (*real_bind)(int, const struct sockaddr *, socklen_t);
static int (*real_connect)(int, const struct sockaddr *, socklen_t);
static int (*real_getaddrinfo)(const char *, const char *, const struct addrinfo *,
                               struct addrinfo **);
static struct in_addr pod_ip;
static int have_pod_ip;
static const char *hosts_path;
static const char *pod_namespace;
static const char *pod_hostname;
static unsigned int shuffle_state;

static void init(void) {
    real_bind = dlsym(RTLD_NEXT, "bind");
    real_connect = dlsym(RTLD_NEXT, "connect");
    real_getaddrinfo = dlsym(RTLD_NEXT, "getaddrinfo");
    const char *ip = getenv("PODNET_IP");
    have_pod_ip = ip != NULL && inet_pton(AF_INET, ip, &pod_ip) == 1;
    hosts_path = getenv("PODNET_HOSTS");
    pod_namespace = getenv("PODNET_NAMESPACE");
    pod_hostname = getenv("PODNET_HOSTNAME");
    shuffle_state = (unsigned int)time(NULL) ^ ((unsigned int)getpid() << 16);
}

static int is_localhost(struct in_addr address) {
    return address.s_addr == htonl(INADDR_LOOPBACK);
}

/* The IPv4 address an IPv6 one maps (::ffff:a.b.c.d), in ``out``; 1 when it is one. */
static int mapped_ipv4(const struct in6_addr *address, struct in_addr *out) {
    if (!IN6_IS_ADDR_V4MAPPED(address)) return 0;
    memcpy(&out->s_addr, &address->s6_addr[12], 4);
    return 1;
}

static void map_ipv4(struct in6_addr *address, struct in_addr ipv4) {
    memset(address, 0, sizeof *address);
    address->s6_addr[10] = 0xff;
    address->s6_addr[11] = 0xff;
    memcpy(&address->s6_addr[12], &ipv4.s_addr, 4);
}

int bind(int fd, const struct sockaddr *address, socklen_t length) {
    pthread_once(&once, init);
    if (have_pod_ip && address != NULL && address->sa_family == AF_INET &&
        length >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in own;
        memcpy(&own, address, sizeof own);
        if (own.sin_addr.s_addr == htonl(INADDR_ANY) || is_localhost(own.sin_addr)) {
            own.sin_addr = pod_ip;
            return real_bind(fd, (const struct sockaddr *)&own, sizeof own);
        }
    }
    if (have_pod_ip && address != NULL && address->sa_family == AF_INET6 &&
        length >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 own;
        memcpy(&own, address, sizeof own);
        struct in_addr ipv4;
        int wildcard = IN6_IS_ADDR_UNSPECIFIED(&own.sin6_addr) ||
                       (mapped_ipv4(&own.sin6_addr, &ipv4) &&
                        (ipv4.s_addr == htonl(INADDR_ANY) || is_localhost(ipv4)));
        if (wildcard) {
            map_ipv4(&own.sin6_addr, pod_ip);
            return real_bind(fd, (const struct sockaddr *)&own, sizeof own);
        }
    }
    return real_bind(fd, address, length);
}

/* Whether a socket listens on the pod's address and this port (host byte order): an IPv4
 * socket, or an IPv6 one on the address's mapped form (its last word, as /proc prints it). */
static int pod_listens(unsigned int port) {
    static const char *tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    static const char *formats[] = {" %*d: %8X:%4X %*8X:%*4X %2X",
                                    " %*d: 0000000000000000FFFF0000%8X:%4X %*32X:%*4X %2X"};
    int found = 0;
    for (int t = 0; t < 2 && !found; t++) {
        FILE *table = fopen(tables[t], "re");
        if (table == NULL) continue;
        char line[512];
        if (fgets(line, sizeof line, table) != NULL) { /* the header */
            while (!found && fgets(line, sizeof line, table) != NULL) {
                unsigned int ip, local_port, state;
                if (sscanf(line, formats[t], &ip, &local_port, &state) == 3)
                    found = state == 0x0A && ip == pod_ip.s_addr && local_port == port;
            }
        }
        fclose(table);
    }
    return found;
}

int connect(int fd, const struct sockaddr *address, socklen_t length) {
    pthread_once(&once, init);
    if (have_pod_ip && address != NULL && address->sa_family == AF_INET &&
        length >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in target;
        memcpy(&target, address, sizeof target);
        if (is_localhost(target.sin_addr) && pod_listens(ntohs(target.sin_port))) {
            target.sin_addr = pod_ip;
            return real_connect(fd, (const struct sockaddr *)&target, sizeof target);
        }
    }
    if (have_pod_ip && address != NULL && address->sa_family == AF_INET6 &&
        length >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 target;
        memcpy(&target, address, sizeof target);
        struct in_addr ipv4;
        if (mapped_ipv4(&target.sin6_addr, &ipv4) && is_localhost(ipv4) &&
            pod_listens(ntohs(target.sin6_port))) {
            map_ipv4(&target.sin6_addr, pod_ip);
            return real_connect(fd, (const struct sockaddr *)&target, sizeof target);
        }
    }
    return real_connect(fd, address, length);
}

struct found {
    struct in_addr ip[MAX_ADDRESSES];
    int port[MAX_ADDRESSES]; /* -1: the port asked for */
    int count;
};

/* Fills ``out`` from the table line for ``name`` and ``port`` (or "*"); 1 when one matched. */
static int look_up(const char *name, const char *port, struct found *out) {
    if (hosts_path == NULL) return 0;
    FILE *table = fopen(hosts_path, "re");
    if (table == NULL) return 0;
    char line[8192];
    char best[8192] = "";
    int matched = 0; /* 2: name and port, 1: name and "*" */
    while (matched < 2 && fgets(line, sizeof line, table) != NULL) {
        char line_name[MAX_NAME], line_port[16];
        int used = 0;
        if (sscanf(line, "%255s %15s %n", line_name, line_port, &used) < 2) continue;
        if (strcmp(line_name, name) != 0) continue;
        int level = strcmp(line_port, "*") == 0 ? 1 : (port && strcmp(line_port, port) == 0) * 2;
        if (level > matched) {
            matched = level;
            snprintf(best, sizeof best, "%s", line + used);
        }
    }
    fclose(table);
    if (!matched) return 0;
    out->count = 0;
    char *saved = NULL;
    for (char *token = strtok_r(best, " \t\n", &saved);
         token != NULL && out->count < MAX_ADDRESSES; token = strtok_r(NULL, " \t\n", &saved)) {
        char *colon = strchr(token, ':');
        int target_port = -1;
        if (colon != NULL) {
            *colon = '\0';
            target_port = atoi(colon + 1);
        }
        if (inet_pton(AF_INET, token, &out->ip[out->count]) == 1)
            out->port[out->count++] = target_port;
    }
    return out->count > 0;
}

/* The table's answer for ``node``: as given, without ".cluster.local", then the search path. */
static int resolve(const char *node, const char *port, struct found *out) {
    char name[MAX_NAME];
    size_t length = strlen(node);
    if (length == 0 || length >= sizeof name) return 0;
    for (size_t i = 0; i <= length; i++)
        name[i] = (char)((node[i] >= 'A' && node[i] <= 'Z') ? node[i] + 32 : node[i]);
    int absolute = name[length - 1] == '.';
    if (absolute) name[--length] = '\0';
    const char *suffix = ".cluster.local";
    size_t suffix_length = strlen(suffix);
    if (length > suffix_length && strcmp(name + length - suffix_length, suffix) == 0)
        name[length - suffix_length] = '\0';
    if (pod_hostname != NULL && have_pod_ip && strcmp(name, pod_hostname) == 0) {
        out->ip[0] = pod_ip;
        out->port[0] = -1;
        out->count = 1;
        return 1;
    }
    if (look_up(name, port, out)) return 1;
    if (absolute || pod_namespace == NULL) return 0;
    char searched[MAX_NAME * 2];
    snprintf(searched, sizeof searched, "%s.%s.svc", name, pod_namespace);
    if (look_up(searched, port, out)) return 1;
    snprintf(searched, sizeof searched, "%s.svc", name);
    return look_up(searched, port, out);
}

struct entry {
    struct addrinfo info;
    struct sockaddr_in address;
};

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **result) {
    pthread_once(&once, init);
    int flags = hints != NULL ? hints->ai_flags : 0;
    int family = hints != NULL ? hints->ai_family : AF_UNSPEC;
    struct found found;
    struct in_addr numeric;
    char *end = NULL;
    long port = service != NULL ? strtol(service, &end, 10) : 0;
    int numeric_service = service == NULL || (end != NULL && *end == '\0' && port >= 0);
    if (node == NULL || (flags & AI_NUMERICHOST) || !numeric_service ||
        (family != AF_UNSPEC && family != AF_INET) || inet_pton(AF_INET, node, &numeric) == 1 ||
        !resolve(node, service, &found))
        return real_getaddrinfo(node, service, hints, result);

    int socktypes[2] = {SOCK_STREAM, SOCK_DGRAM};
    int socktype_count = 2;
    if (hints != NULL && hints->ai_socktype != 0) {
        socktypes[0] = hints->ai_socktype;
        socktype_count = 1;
    }
    /* A random first endpoint, as a Service balances connections. */
    int first = found.count > 1 ? (int)(rand_r(&shuffle_state) % (unsigned int)found.count) : 0;
    struct addrinfo *head = NULL, **tail = &head;
    for (int n = 0; n < found.count; n++) {
        int i = (first + n) % found.count;
        for (int s = 0; s < socktype_count; s++) {
            struct entry *entry = calloc(1, sizeof *entry);
            if (entry == NULL) {
                freeaddrinfo(head);
                return EAI_MEMORY;
            }
            entry->address.sin_family = AF_INET;
            entry->address.sin_addr = found.ip[i];
            entry->address.sin_port = htons((unsigned short)(found.port[i] >= 0 ? found.port[i] : port));
            entry->info.ai_family = AF_INET;
            entry->info.ai_socktype = socktypes[s];
            entry->info.ai_protocol = socktypes[s] == SOCK_STREAM ? IPPROTO_TCP
                                      : socktypes[s] == SOCK_DGRAM ? IPPROTO_UDP : 0;
            entry->info.ai_addrlen = sizeof entry->address;
            entry->info.ai_addr = (struct sockaddr *)&entry->address;
            if (head == NULL && (flags & AI_CANONNAME)) entry->info.ai_canonname = strdup(node);
            *tail = &entry->info;
            tail = &entry->info.ai_next;
        }
    }
    *result = head;
    return 0;
}
