/* SPDX-License-Identifier: Apache-2.0 */
/* keep: the supervisor's table of a mount's connection and node ids, fed
 * through a real SOCK_SEQPACKET socketpair with real descriptors. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "airlock/mount/keep.h"

static int sp[2];

static int setup(void **state)
{
	(void)state;
	return socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp);
}

static int teardown(void **state)
{
	(void)state;
	close(sp[0]);
	close(sp[1]);
	return 0;
}

/* Send header + data with the given descriptors (duplicated by the kernel). */
static void send_msg(uint32_t type, uint32_t n, const void *data, size_t len, const int *fds, size_t nfd)
{
	struct keep_msg h = {.type = type, .n = n};
	struct iovec iov[2] = {{.iov_base = &h, .iov_len = sizeof(h)}, {.iov_base = (void *)data, .iov_len = len}};
	char cbuf[CMSG_SPACE(KEEP_BATCH * sizeof(int))];
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
	struct cmsghdr *c;

	if (nfd) {
		memset(cbuf, 0, sizeof(cbuf));
		mh.msg_control = cbuf;
		mh.msg_controllen = CMSG_SPACE(nfd * sizeof(int));
		c = CMSG_FIRSTHDR(&mh);
		assert_non_null(c);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(nfd * sizeof(int));
		memcpy(CMSG_DATA(c), fds, nfd * sizeof(int));
	}
	assert_true(sendmsg(sp[1], &mh, 0) >= 0);
}

static int open_null(void)
{
	int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	return fd;
}

static size_t open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	size_t n = 0;

	assert_non_null(d);
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

static size_t count(struct mount_keep *k, uint64_t id)
{
	size_t n, hits = 0;
	const struct mount_kept *l = mount_keep_list(k, &n);

	for (size_t i = 0; i < n; i++)
		hits += l[i].nodeid == id;
	return hits;
}

static void test_conn_add_drop(void **state)
{
	(void)state;
	struct mount_keep *k = mount_keep_new();
	const char init[48] = {1, 2, 3};
	const void *got;
	size_t len, n;
	int fd = open_null(), fds[2] = {open_null(), open_null()};
	struct keep_rec recs[3] = {
	    {.nodeid = 10, .op = KEEP_ADD}, {.nodeid = 11, .op = KEEP_ADD}, {.nodeid = 10, .op = KEEP_DROP}};

	assert_non_null(k);
	assert_int_equal(mount_keep_conn(k, &got, &len), -1);
	send_msg(KEEP_CONN, sizeof(init), init, sizeof(init), &fd, 1);
	assert_int_equal(mount_keep_recv(k, sp[0]), 1);
	assert_true(mount_keep_conn(k, &got, &len) >= 0);
	assert_int_equal(len, sizeof(init));
	assert_memory_equal(got, init, sizeof(init));
	send_msg(KEEP_NODES, 3, recs, sizeof(recs), fds, 2);
	assert_int_equal(mount_keep_recv(k, sp[0]), 1);
	assert_int_equal(count(k, 10), 0);
	assert_int_equal(count(k, 11), 1);
	mount_keep_list(k, &n);
	assert_int_equal(n, 1);
	/* an id added again replaces the old descriptor */
	send_msg(KEEP_NODES, 1, &recs[1], sizeof(recs[1]), &fds[0], 1);
	assert_int_equal(mount_keep_recv(k, sp[0]), 1);
	assert_int_equal(count(k, 11), 1);
	close(fd);
	close(fds[0]);
	close(fds[1]);
	mount_keep_free(k);
}

/* Malformed messages change nothing and close what they carried. */
static void test_malformed(void **state)
{
	(void)state;
	struct mount_keep *k = mount_keep_new();
	struct keep_rec add = {.nodeid = 7, .op = KEEP_ADD}, bad = {.nodeid = 8, .op = 99};
	int fd = open_null();
	size_t n, fds0 = open_fds();

	/* an ADD without its descriptor, an unknown op, a count that lies,
	 * an unknown type, a CONN without a descriptor */
	send_msg(KEEP_NODES, 1, &add, sizeof(add), NULL, 0);
	assert_int_equal(mount_keep_recv(k, sp[0]), -EPROTO);
	send_msg(KEEP_NODES, 1, &bad, sizeof(bad), NULL, 0);
	assert_int_equal(mount_keep_recv(k, sp[0]), -EPROTO);
	send_msg(KEEP_NODES, 2, &add, sizeof(add), &fd, 1);
	assert_int_equal(mount_keep_recv(k, sp[0]), -EPROTO);
	send_msg(KEEP_NODES, KEEP_BATCH + 1, &add, sizeof(add), &fd, 1);
	assert_int_equal(mount_keep_recv(k, sp[0]), -EPROTO);
	send_msg(42, 0, NULL, 0, &fd, 1);
	assert_int_equal(mount_keep_recv(k, sp[0]), -EPROTO);
	send_msg(KEEP_CONN, 4, "abcd", 4, NULL, 0);
	assert_int_equal(mount_keep_recv(k, sp[0]), -EPROTO);
	mount_keep_list(k, &n);
	assert_int_equal(n, 0);
	/* the descriptors that came with refused messages were closed */
	assert_int_equal(open_fds(), fds0);
	close(fd);
	/* end of stream */
	close(sp[1]);
	sp[1] = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	assert_int_equal(mount_keep_recv(k, sp[0]), 0);
	mount_keep_free(k);
}

/* Many ids: the table grows and keeps every one exactly once. */
static void test_many(void **state)
{
	(void)state;
	struct mount_keep *k = mount_keep_new();
	struct keep_rec recs[KEEP_BATCH];
	int fds[KEEP_BATCH];
	size_t n;

	for (uint64_t base = 0; base < 64 * KEEP_BATCH; base += KEEP_BATCH) {
		for (size_t i = 0; i < KEEP_BATCH; i++) {
			recs[i] = (struct keep_rec){.nodeid = base + i + 2, .op = KEEP_ADD};
			fds[i] = open_null();
		}
		send_msg(KEEP_NODES, KEEP_BATCH, recs, sizeof(recs), fds, KEEP_BATCH);
		for (size_t i = 0; i < KEEP_BATCH; i++)
			close(fds[i]);
		assert_int_equal(mount_keep_recv(k, sp[0]), 1);
	}
	mount_keep_list(k, &n);
	assert_int_equal(n, 64 * KEEP_BATCH);
	assert_int_equal(count(k, 2), 1);
	assert_int_equal(count(k, 64 * KEEP_BATCH + 1), 1);
	mount_keep_release(k);
	mount_keep_list(k, &n);
	assert_int_equal(n, 0);
	mount_keep_free(k);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_conn_add_drop, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_malformed, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_many, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
