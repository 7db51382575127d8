/* SPDX-License-Identifier: Apache-2.0 */
/*
 * transport backend for serial:DEVICE, the guest end of a virtio-serial port
 * (or any tty or character device). There is no connection to accept: the
 * device is one stream whose host end comes and goes. "listen" opens the
 * device; "accept" hands out a dup of it once per session; "release" ends
 * the session so the next accept hands it out again.
 *
 * A session needs someone at the other end. A virtio-serial port whose host
 * end is not connected (and a pty whose master is closed) reports POLLHUP
 * and reads return end-of-file at once; handing it out would make a session
 * that ends immediately, over and over. So "accept" also says -EAGAIN while
 * the device reports a hangup: the listener waits for the device's next
 * state change (an edge-triggered epoll on the listening fd sees the host
 * connecting: the port's wait queue is woken then) and tries again. Each
 * host connection to the chardev thus gives the agent one fresh session.
 *
 * The session state has to live somewhere, and the interface only gives us
 * the listening fd, so it lives in a small table keyed by that fd and by the
 * device's identity (st_dev, st_ino), which tells a reused fd number from the
 * one we opened.
 */
#include "transport_i.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#define SERIAL_SLOTS 32

struct serial_slot {
	int fd; /* -1: free */
	dev_t dev;
	ino_t ino;
	int handed_out; /* a session holds a dup of fd */
};

/* protected by serial_lock */
static struct serial_slot serial_slots[SERIAL_SLOTS];
static int serial_slots_ready;
static pthread_mutex_t serial_lock = PTHREAD_MUTEX_INITIALIZER;

/* must hold serial_lock */
static void serial_slots_init(void)
{
	if (serial_slots_ready)
		return;
	for (int i = 0; i < SERIAL_SLOTS; i++)
		serial_slots[i].fd = -1;
	serial_slots_ready = 1;
}

/* True when slot still describes the file open at its fd.
 * must hold serial_lock */
static int serial_slot_live(const struct serial_slot *s)
{
	struct stat st;

	return s->fd >= 0 && fstat(s->fd, &st) == 0 && st.st_dev == s->dev && st.st_ino == s->ino;
}

/* Find the slot for lfd into *out, (re)creating it when absent or stale.
 * 0, -EBADF (or another fstat error) for a bad lfd, -EMFILE when the table
 * is full of live listeners.
 * must hold serial_lock */
static int serial_slot_get(int lfd, int reset, struct serial_slot **out)
{
	struct serial_slot *free_slot = NULL;
	struct stat st;

	serial_slots_init();
	if (fstat(lfd, &st) < 0)
		return -errno;
	for (int i = 0; i < SERIAL_SLOTS; i++) {
		struct serial_slot *s = &serial_slots[i];

		if (s->fd == lfd && s->dev == st.st_dev && s->ino == st.st_ino) {
			if (reset)
				s->handed_out = 0;
			*out = s;
			return 0;
		}
		if (!free_slot && (s->fd < 0 || s->fd == lfd || !serial_slot_live(s)))
			free_slot = s;
	}
	if (!free_slot)
		return -EMFILE;
	free_slot->fd = lfd;
	free_slot->dev = st.st_dev;
	free_slot->ino = st.st_ino;
	free_slot->handed_out = 0;
	*out = free_slot;
	return 0;
}

static int serial_parse(const char *rest, struct transport_addr *a, const char *shown, char *err, size_t errlen)
{
	return transport_set_path(a, rest, strlen(rest), "device", shown, err, errlen);
}

static void serial_format(const struct transport_addr *a, char *out, size_t n)
{
	snprintf(out, n, "serial:%s", a->path);
}

static int serial_connect(const struct transport_addr *a, int64_t deadline, int timeout_ms, char *err, size_t errlen)
{
	(void)deadline;
	(void)timeout_ms;
	transport_addr_err(a, err, errlen, "a serial device is the guest's end: listen on it, do not connect");
	return -ENOTSUP;
}

static int serial_listen(const struct transport_addr *a, char *err, size_t errlen)
{
	struct serial_slot *s;
	char why[128];
	int fd, r;

	fd = open(a->path, O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		transport_addr_err(a, err, errlen, "cannot open the device: %s",
				   transport_reason(-r, why, sizeof(why)));
		return r;
	}
	if (isatty(fd)) {
		struct termios t;

		/* Raw: no line discipline, echo, signals or CR/NL translation;
		 * the channel's frames are binary. */
		if (tcgetattr(fd, &t) < 0)
			goto fail_errno;
		cfmakeraw(&t);
		t.c_cc[VMIN] = 1;
		t.c_cc[VTIME] = 0;
		if (tcsetattr(fd, TCSANOW, &t) < 0)
			goto fail_errno;
	}
	pthread_mutex_lock(&serial_lock);
	r = serial_slot_get(fd, 1, &s);
	pthread_mutex_unlock(&serial_lock);
	if (r < 0) {
		transport_addr_err(a, err, errlen, "too many serial devices open (at most %d)", SERIAL_SLOTS);
		close(fd);
		return r;
	}
	return fd;
fail_errno:
	r = -errno;
	transport_addr_err(a, err, errlen, "cannot switch the tty to raw mode: %s",
			   transport_reason(-r, why, sizeof(why)));
	close(fd);
	return r;
}

/* True when nobody is at the other end: the device reports a hangup. */
static int serial_peer_absent(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};

	return poll(&p, 1, 0) == 1 && (p.revents & POLLHUP);
}

static int serial_accept(const struct transport_addr *a, int lfd)
{
	struct serial_slot *s;
	int fd;

	(void)a;
	pthread_mutex_lock(&serial_lock);
	fd = serial_slot_get(lfd, 0, &s);
	if (fd < 0) {
		/* lfd is bad, or the table is full */
	} else if (s->handed_out || serial_peer_absent(lfd)) {
		fd = -EAGAIN;
	} else {
		fd = fcntl(lfd, F_DUPFD_CLOEXEC, 0); /* shares O_NONBLOCK with lfd */
		if (fd < 0)
			fd = -errno;
		else
			s->handed_out = 1;
	}
	pthread_mutex_unlock(&serial_lock);
	return fd;
}

static void serial_release(const struct transport_addr *a, int lfd)
{
	struct serial_slot *s;

	(void)a;
	pthread_mutex_lock(&serial_lock);
	(void)serial_slot_get(lfd, 1, &s);
	pthread_mutex_unlock(&serial_lock);
}

const struct transport_ops transport_serial_ops = {
    .scheme = "serial",
    .stream_listener = 0,
    .parse = serial_parse,
    .format = serial_format,
    .connect = serial_connect,
    .listen = serial_listen,
    .accept = serial_accept,
    .release = serial_release,
};
