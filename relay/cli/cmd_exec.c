/* SPDX-License-Identifier: Apache-2.0 */
/*
 * airlock exec [-C DIR] [--timeout S] [--tty] [--stdin|--no-stdin] -- CMD [ARG...]
 * airlock shell [-C DIR] [--timeout S] [--bash] [-c CMD [NAME [ARG...]]]   (see cmd_shell)
 *
 * Run from a directory below the workspace (or -C one), the command runs in
 * the same directory of the guest's copy: the workspace is the nearest
 * airlock mount at or above DIR.
 *
 * A client of the relay socket (doc/RELAY.md) that behaves like the command
 * it runs in the guest: its stdout and stderr go to ours, our stdin is
 * passed when it is not a terminal or /dev/null (or with --stdin, or --tty), SIGINT,
 * SIGTERM, SIGHUP and SIGQUIT are forwarded as `signal` requests, and the
 * exit status is the remote one: the code, 128+N for signal N, 124 when the
 * timeout fired (timeout(1)). 125 means the command could not be run at all
 * (no relay, no guest, a refused request); the reason is printed.
 *
 * --tty: the command gets a pty in the guest sized like our terminal;
 * our terminal (when stdin is one) is in raw mode while it runs, so keys
 * like ^C and ^Z reach the guest's terminal as bytes and its line
 * discipline turns them into signals there; SIGWINCH becomes `resize`.
 * The terminal is restored on every way out.
 *
 * stdin requests are answered only on failure, so after each chunk we send
 * a `status` request as a fence: a `busy` error before the fence's answer
 * means the sandbox's input window was full, and the chunk is sent again.
 *
 * A command started through us ends when we do, as a local child would,
 * even when we are killed with SIGKILL (an agent CLI's timeout kills the
 * process group it started): the request asks for "cancel_on_close", so
 * the relay cancels it when our connection closes (doc/RELAY.md, protocol
 * 3). A relay of protocol 2 (an `airlock up` started before an upgrade)
 * refuses that field; then the request is sent again without it, and a
 * guard process does the same from outside (guard_start).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "airlock/core/buf.h"
#include "airlock/core/io.h"
#include "airlock/core/mem.h"
#include "airlock/mount/mount.h"
#include "airlock/server/relay.h"
#include "cmd_i.h"
#include "shell_cwd_i.h"

#define EXEC_FAILED 125
#define STDIN_CHUNK (32u * 1024u)
#define IN_MAX	    ((size_t)8 << 20) /* longest event line we accept from the relay */
#define FENCE_ID    "airlock-exec-fence"

struct xc {
	int fd;
	char id[64];
	struct buf in; /* bytes from the relay, up to one partial line */
	bool started, done;
	int status;	/* exit status once done */
	int cancel_sig; /* a signal that arrived before `started`: the command was canceled */
	bool timed_out; /* the exit event said so; duration_ms its duration */
	double duration_ms;
	/* stdin */
	bool want_stdin, stdin_eof_sent;
	uint8_t chunk[STDIN_CHUNK];
	size_t chunk_n;
	bool chunk_eof;	 /* the chunk ends stdin */
	bool in_flight;	 /* chunk sent, fence not answered yet */
	bool chunk_busy; /* the relay answered busy: send it again */
	uint64_t retry_at_ms;
	unsigned backoff_ms;
	struct shell_cwd *cwd;	   /* --cwd-file: its line taken out of stderr */
	char sock[PATH_MAX];	   /* the relay's socket, for the guard */
	json_int_t relay_protocol; /* the relay's hello said so; 0 before it came */
	bool cancel_on_close;	   /* the request asked for it */
	bool old_relay;		   /* the relay refused it: send again, with a guard */
};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Send one request object (consumed), its line and newline in one write:
 * the relay wakes once for it, not once more for a lone newline. */
static int send_req(struct xc *x, json_t *o)
{
	char *line;
	int r;

	if (!o)
		return -ENOMEM;
	line = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	if (!line)
		return -ENOMEM;
	size_t n = strlen(line);
	line[n] = '\n'; /* in place of the NUL: n + 1 bytes, never read as a string again */
	r = io_write_all(x->fd, line, n + 1);
	mem_free(line); /* jansson allocates through mem_* (mem_init_json) */
	return r;
}

static int send_chunk(struct xc *x)
{
	char *b64 = NULL;
	size_t blen = sodium_base64_ENCODED_LEN(x->chunk_n, sodium_base64_VARIANT_ORIGINAL);
	json_t *o;
	int r;

	if (!(b64 = mem_alloc(blen)))
		return -ENOMEM;
	sodium_bin2base64(b64, blen, x->chunk, x->chunk_n, sodium_base64_VARIANT_ORIGINAL);
	o = json_pack("{s:s, s:s, s:s, s:b}", "id", x->id, "op", "stdin", "data_b64", b64, "eof", x->chunk_eof);
	mem_free(b64);
	if ((r = send_req(x, o)) < 0)
		return r;
	x->in_flight = true;
	x->chunk_busy = false;
	return send_req(x, json_pack("{s:s, s:s}", "id", FENCE_ID, "op", "status"));
}

/* Command output to our fd (through the --cwd-file filter: its line comes on
 * stderr, or on stdout when the two are merged). */
static int out_write(struct xc *x, int fd, const void *p, size_t n)
{
	if (x->cwd)
		return shell_cwd_filter(x->cwd, fd, p, n);
	return io_write_all(fd, p, n);
}

/* Output data of an stdout/stderr event to fd. */
static int emit(struct xc *x, json_t *ev, int fd)
{
	const char *t = json_string_value(json_object_get(ev, "data"));
	const char *b = json_string_value(json_object_get(ev, "data_b64"));
	uint8_t *bin;
	size_t n;
	int r;

	if (t)
		return out_write(x, fd, t, json_string_length(json_object_get(ev, "data")));
	if (!b)
		return 0;
	n = strlen(b);
	if (!(bin = mem_alloc(n / 4 * 3 + 3)))
		return -ENOMEM;
	if (sodium_base642bin(bin, n / 4 * 3 + 3, b, n, NULL, &n, NULL, sodium_base64_VARIANT_ORIGINAL) < 0) {
		mem_free(bin);
		return -EBADMSG;
	}
	r = out_write(x, fd, bin, n);
	mem_free(bin);
	return r;
}

/* Output we could not write (EPIPE: our reader is gone): stop the command. */
static void output_gone(struct xc *x)
{
	if (x->done)
		return;
	send_req(x, json_pack("{s:s, s:s}", "id", x->id, "op", "cancel"));
	x->done = true;
	x->status = 141;
}

/*
 * We ask for "encoding":"base64", and the relay writes those output events
 * in one fixed shape without a JSON tree (relay.c client_send_b64):
 *   {"event":"stdout","id":"<our id>","offset":N,"data_b64":"<base64>"}
 * Decoding that shape directly spares a JSON parse of every output byte
 * (which dominated the CPU of `airlock exec` on a flood). 1 when the line
 * was such an event and is handled; 0 for any other line (parsed as JSON).
 */
static int fast_output(struct xc *x, const char *p, size_t n)
{
	static const char *const names[2] = {"stdout", "stderr"};
	static const char mid[] = ",\"data_b64\":\"";

	for (int k = 0; k < 2; k++) {
		char head[160];
		int hn = snprintf(head, sizeof(head), "{\"event\":\"%s\",\"id\":\"%s\",\"offset\":", names[k], x->id);
		if (hn < 0 || (size_t)hn >= sizeof(head) || n < (size_t)hn || memcmp(p, head, (size_t)hn) != 0)
			continue;
		size_t i = (size_t)hn;
		while (i < n && p[i] >= '0' && p[i] <= '9')
			i++;
		if (i == (size_t)hn || n - i < sizeof(mid) - 1 + 2 || memcmp(p + i, mid, sizeof(mid) - 1) != 0 ||
		    p[n - 2] != '"' || p[n - 1] != '}')
			return 0;
		const char *b = p + i + sizeof(mid) - 1;
		size_t bn = n - 2 - (i + sizeof(mid) - 1), len;
		uint8_t *bin = mem_alloc(bn / 4 * 3 + 3);
		if (!bin || sodium_base642bin(bin, bn / 4 * 3 + 3, b, bn, NULL, &len, NULL,
					      sodium_base64_VARIANT_ORIGINAL) < 0) {
			mem_free(bin);
			return 0; /* not what it looked like: the JSON path decides */
		}
		if (out_write(x, k ? STDERR_FILENO : STDOUT_FILENO, bin, len) < 0)
			output_gone(x);
		mem_free(bin);
		return 1;
	}
	return 0;
}

/* One event line. */
/* The exit event's guest changes, as one line on stderr (doc/RELAY.md "Changes"). */
static void changes_line(json_t *ch)
{
	json_int_t wb = json_integer_value(json_object_get(ch, "written_back"));
	json_int_t wt = json_integer_value(json_object_get(ch, "waiting"));

	if (!json_is_object(ch) || (wb <= 0 && wt <= 0))
		return;
	if (wt > 0)
		cmd_err("%" JSON_INTEGER_FORMAT " change%s written back, %" JSON_INTEGER_FORMAT " wait%s for review "
			"(airlock changes)",
			wb, wb == 1 ? "" : "s", wt, wt == 1 ? "s" : "");
	else
		cmd_err("%" JSON_INTEGER_FORMAT " change%s written back", wb, wb == 1 ? "" : "s");
}

static void on_event(struct xc *x, json_t *ev)
{
	const char *event = json_string_value(json_object_get(ev, "event"));
	const char *id = json_string_value(json_object_get(ev, "id"));
	bool mine = id && !strcmp(id, x->id), fence = id && !strcmp(id, FENCE_ID);

	if (!event)
		return;
	if (!strcmp(event, "hello")) {
		x->relay_protocol = json_integer_value(json_object_get(ev, "protocol"));
		return;
	}
	if (!strcmp(event, "status") && fence) {
		x->in_flight = false;
		if (x->chunk_busy) {
			x->retry_at_ms = now_ms() + x->backoff_ms;
			x->backoff_ms = x->backoff_ms < 50 ? x->backoff_ms * 2 : 50;
		} else {
			x->backoff_ms = 1;
			if (x->chunk_eof)
				x->stdin_eof_sent = true;
			x->chunk_n = 0;
			x->chunk_eof = false;
		}
		return;
	}
	if (!mine)
		return;
	if (!strcmp(event, "started")) {
		x->started = true;
	} else if (!strcmp(event, "stdout") || !strcmp(event, "stderr")) {
		if (emit(x, ev, !strcmp(event, "stdout") ? STDOUT_FILENO : STDERR_FILENO) < 0)
			output_gone(x);
	} else if (!strcmp(event, "dropped")) {
		cmd_err("exec: %" JSON_INTEGER_FORMAT " bytes of %s were lost",
			json_integer_value(json_object_get(ev, "bytes")),
			json_string_value(json_object_get(ev, "stream"))
			    ? json_string_value(json_object_get(ev, "stream"))
			    : "output");
	} else if (!strcmp(event, "exit")) {
		json_t *sig = json_object_get(ev, "signal");
		x->done = true;
		x->duration_ms = json_number_value(json_object_get(ev, "duration_ms"));
		if ((x->timed_out = json_is_true(json_object_get(ev, "timed_out"))))
			x->status = 124;
		else if (json_is_integer(sig) && x->cancel_sig)
			x->status = 128 + x->cancel_sig; /* our cancel (for signal N, before it started) killed it */
		else if (json_is_integer(sig))
			x->status = 128 + (int)json_integer_value(sig);
		else
			x->status = (int)json_integer_value(json_object_get(ev, "code")) & 0xff;
		changes_line(json_object_get(ev, "changes"));
	} else if (!strcmp(event, "error")) {
		const char *code = json_string_value(json_object_get(ev, "code"));
		const char *msg = json_string_value(json_object_get(ev, "message"));
		if (code && !strcmp(code, "busy") && x->in_flight) {
			x->chunk_busy = true; /* the stdin chunk: sent again after the fence */
			return;
		}
		if (x->started && code && (!strcmp(code, "stdin_closed") || !strcmp(code, "not_running")))
			return; /* the command stopped reading or ended: its exit follows */
		if (code && !strcmp(code, "canceled") && x->cancel_sig) {
			x->done = true;
			x->status = 128 + x->cancel_sig;
			return;
		}
		if (code && !strcmp(code, "busy") && x->started)
			return; /* a signal the sandbox could not take now */
		if (code && !strcmp(code, "bad_field") && msg && strstr(msg, "'cancel_on_close'") && !x->started &&
		    x->cancel_on_close && x->relay_protocol < 3) {
			x->old_relay = true; /* run_remote sends it again without, and guards it */
			return;
		}
		cmd_err("exec: %s (%s)", msg ? msg : "failed", code ? code : "error");
		if (!x->started || (code && strcmp(code, "busy"))) {
			x->done = true;
			x->status = EXEC_FAILED;
		}
	}
}

int cmd_connect_relay(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

/* The workspace holding dir: the nearest airlock mount at or above it
 * (realpath in root). *rel points into root's buffer at dir's path below it
 * ("" = the root itself). Without such a mount the workspace is dir. */
bool cmd_find_workspace(char *root, const char **rel)
{
	size_t full = strlen(root);
	char *cut = NULL; /* the '/' we replaced with NUL last */

	for (;;) {
		if (mount_is_airlock(root) == 1) {
			*rel = cut ? cut + 1 : root + full;
			return true;
		}
		char *slash = strrchr(root, '/');
		if (!slash || slash == root)
			break;
		if (cut)
			*cut = '/';
		*slash = '\0';
		cut = slash;
	}
	if (cut)
		*cut = '/';
	*rel = root + full; /* no airlock mount above: the workspace is dir itself */
	return false;
}

static void exec_usage(void)
{
	cmd_usage("exec");
}

static void shell_usage(void)
{
	fputs("usage: airlock shell [-C DIR] [--timeout S] [--bash] [-l|--login] [-i] [-c CMD [NAME [ARG...]]]\n",
	      stderr);
}

/* What to run and how: filled by cmd_exec and cmd_shell. */
struct run_opts {
	const char *who; /* "exec" or "shell", for messages */
	const char *dir;
	double timeout;	      /* seconds; 0 = the policy's default */
	int stdin_mode;	      /* 1 pass stdin, 0 /dev/null, -1 pass it unless it is a terminal */
	bool tty;	      /* a pty in the guest; ours in raw mode when it is a terminal */
	const char *cwd_file; /* shell --cwd-file: argv is SHELL_CWD_SCRIPT's, REL and MARK appended */
	const char *fork;     /* exec --fork NAME: in that fork of the sandbox (doc/SANDBOX.md "Forks") */
	char *const *argv;    /* argc strings */
	int argc;
};

/* The local terminal, put in raw mode while a tty command runs. Restored on
 * every way out of run_remote (its one exit); the signals that would end
 * us without passing there (INT, TERM, HUP, QUIT) are taken by the
 * signalfd instead, and forwarded to the command. */
static struct termios saved_tio;
static int raw_fd = -1;

static void term_restore(void)
{
	if (raw_fd >= 0) {
		tcsetattr(raw_fd, TCSADRAIN, &saved_tio);
		raw_fd = -1;
	}
}

static void term_raw(int fd)
{
	struct termios t;

	if (!isatty(fd) || tcgetattr(fd, &saved_tio) < 0)
		return;
	t = saved_tio;
	cfmakeraw(&t);
	if (tcsetattr(fd, TCSADRAIN, &t) == 0)
		raw_fd = fd;
}

/* The local window size, from whichever of stdin, stdout, stderr is a
 * terminal; 24x80 when none is. */
static void term_size(unsigned *rows, unsigned *cols)
{
	static const int fds[] = {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO};
	struct winsize ws;

	*rows = 24;
	*cols = 80;
	for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++) {
		if (ioctl(fds[i], TIOCGWINSZ, &ws) == 0 && ws.ws_row && ws.ws_col) {
			*rows = ws.ws_row;
			*cols = ws.ws_col;
			return;
		}
	}
}

static const char *sig_name(uint32_t signo)
{
	switch (signo) {
	case SIGINT:
		return "INT";
	case SIGHUP:
		return "HUP";
	case SIGQUIT:
		return "QUIT";
	default:
		return "TERM";
	}
}

/* Our stdin is /dev/null: there is nothing to pass, and the command gets
 * /dev/null in the guest anyway (saves a stdin request and its fence). */
static bool stdin_is_null(void)
{
	struct stat a, b;

	return fstat(STDIN_FILENO, &a) == 0 && stat("/dev/null", &b) == 0 && S_ISCHR(a.st_mode) &&
	       a.st_rdev == b.st_rdev;
}

/* o->dir is the directory under the mount at root, not the mount (a shell
 * that was in it before airlock up mounted over it): what it writes there
 * never reaches the sandbox. Say so; the command still runs. mounted: root
 * is an airlock mount (cmd_find_workspace: mountinfo is read once). */
static void warn_under_mount(const struct run_opts *o, const char *root, bool mounted)
{
	struct stat here, mnt;

	if (mounted && stat(o->dir, &here) == 0 && stat(root, &mnt) == 0 && here.st_dev != mnt.st_dev)
		cmd_err("%s: warning: %s is the directory under the airlock mount of %s, not the mount: files "
			"written from here never reach the sandbox. Run: cd \"$PWD\"",
			o->who, !strcmp(o->dir, ".") ? "the current directory" : o->dir, root);
}

/* The workspace of o->dir (real, rel: o->dir's path below it) and a
 * connection to its relay socket in x->fd. 0, or -1 after saying why. */
static int connect_workspace(const struct run_opts *o, struct xc *x, char real[PATH_MAX], const char **rel)
{
	char *sock = x->sock;
	int r;

	if (!realpath(o->dir, real)) {
		cmd_err("%s: workspace %s: %s", o->who, o->dir, strerror(errno));
		return -1;
	}
	bool mounted = cmd_find_workspace(real, rel);
	warn_under_mount(o, real, mounted);
	if ((r = relay_default_path(real, sock, sizeof(x->sock))) < 0) {
		cmd_err("%s: relay socket for %s: %s", o->who, real, strerror(-r));
		return -1;
	}
	if ((x->fd = cmd_connect_relay(sock)) < 0) {
		cmd_err("%s: cannot reach the relay at %s: %s (is 'airlock up %s' running?)", o->who, sock,
			strerror(-x->fd), real);
		return -1;
	}
	return 0;
}

/* INT, TERM, HUP, QUIT (forwarded) and WINCH (a resize) arrive through a
 * signalfd from here on. The fd, or -1 after saying why. */
static int take_signals(const struct run_opts *o)
{
	sigset_t set;
	int sfd;

	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	sigaddset(&set, SIGQUIT);
	sigaddset(&set, SIGWINCH);
	sigprocmask(SIG_BLOCK, &set, NULL);
	if ((sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK)) < 0)
		cmd_err("%s: signalfd: %s", o->who, strerror(errno));
	return sfd;
}

/* The exec request (doc/RELAY.md) in *out, with "cancel_on_close" when
 * x->cancel_on_close. 0, -ENOMEM, or -EILSEQ when an argument is not
 * valid UTF-8. */
static int exec_request(const struct run_opts *o, const struct xc *x, const char *rel, json_t **out)
{
	unsigned rows, cols;
	json_t *req, *av;

	*out = NULL;
	if (!(req = json_pack("{s:s, s:s, s:[], s:b, s:s}", "id", x->id, "op", "exec", "argv", "stdin", x->want_stdin,
			      "encoding", "base64")))
		return -ENOMEM;
	if (x->cancel_on_close && json_object_set_new(req, "cancel_on_close", json_true()) < 0)
		goto nomem;
	av = json_object_get(req, "argv");
	for (int i = 0; i < o->argc; i++)
		if (json_array_append_new(av, json_string(o->argv[i])) < 0)
			goto nomem;
	if (o->cwd_file && (json_array_append_new(av, json_string(rel)) < 0 ||
			    json_array_append_new(av, json_string(x->cwd->mark)) < 0))
		goto nomem;
	if (json_array_size(av) != (size_t)o->argc + (o->cwd_file ? 2 : 0)) {
		json_decref(req);
		return -EILSEQ;
	}
	if (*rel && json_object_set_new(req, "cwd", json_string(rel)) < 0)
		goto nomem;
	if (o->timeout > 0 && json_object_set_new(req, "timeout_seconds", json_real(o->timeout)) < 0)
		goto nomem;
	if (o->fork && json_object_set_new(req, "fork", json_string(o->fork)) < 0)
		goto nomem;
	if (o->tty) {
		term_size(&rows, &cols);
		if (json_object_set_new(req, "tty", json_pack("{s:i, s:i}", "rows", (int)rows, "cols", (int)cols)) < 0)
			goto nomem;
	}
	*out = req;
	return 0;
nomem:
	json_decref(req);
	return -ENOMEM;
}

/* Signals that arrived: a resize to send later, a cancel before the
 * command started (it may still wait for its barrier), else a signal. */
static void on_signals(const struct run_opts *o, struct xc *x, int sfd, bool *winch)
{
	struct signalfd_siginfo si;

	while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
		if (si.ssi_signo == SIGWINCH) {
			*winch = o->tty;
		} else if (!x->started) {
			x->cancel_sig = (int)si.ssi_signo;
			send_req(x, json_pack("{s:s, s:s}", "id", x->id, "op", "cancel"));
		} else {
			send_req(x, json_pack("{s:s, s:s, s:s}", "id", x->id, "op", "signal", "signal",
					      sig_name(si.ssi_signo)));
		}
	}
}

/* Read one chunk of our stdin and send it. 0, 1 when the read was
 * interrupted, or -errno from sending. */
static int read_stdin(struct xc *x)
{
	ssize_t n = read(STDIN_FILENO, x->chunk, sizeof(x->chunk));

	if (n < 0 && (errno == EINTR || errno == EAGAIN))
		return 1;
	x->chunk_n = n > 0 ? (size_t)n : 0;
	x->chunk_eof = n <= 0;
	return send_chunk(x);
}

/* Read from the relay and handle every whole event line. 0 to go on, or
 * -1 when the run is over (x->status says how). */
static int read_relay(const struct run_opts *o, struct xc *x)
{
	uint8_t *p;
	ssize_t n;

	if (buf_reserve(&x->in, 64 * 1024, &p) < 0) {
		cmd_err("%s: an event line from the relay is longer than %zu bytes", o->who, IN_MAX);
		x->status = EXEC_FAILED;
		return -1;
	}
	n = read(x->fd, p, 64 * 1024);
	if (n < 0 && (errno == EINTR || errno == EAGAIN))
		return 0;
	if (n <= 0) {
		term_restore();
		cmd_err("%s: the relay closed the connection before the command ended", o->who);
		x->status = EXEC_FAILED;
		return -1;
	}
	buf_commit(&x->in, (size_t)n);
	while (!x->done) {
		const uint8_t *s = buf_ptr(&x->in), *nl = memchr(s, '\n', buf_len(&x->in));
		json_t *ev;
		if (!nl)
			break;
		/* output may hold NUL bytes ("\u0000" in valid UTF-8 text) */
		if (fast_output(x, (const char *)s, (size_t)(nl - s))) {
			/* handled */
		} else if ((ev = json_loadb((const char *)s, (size_t)(nl - s), JSON_ALLOW_NUL, NULL))) {
			on_event(x, ev);
			json_decref(ev);
		} else {
			cmd_err("%s: the relay sent a line that is not JSON; ignored", o->who);
		}
		buf_consume(&x->in, (size_t)(nl - s) + 1);
	}
	return 0;
}

/* One turn of the client's loop: send what is due, wait, handle what came.
 * 0 to go on, 1 when the run is over (x->status says how), or -errno when
 * writing to the relay failed. */
static int run_once(const struct run_opts *o, struct xc *x, int sfd, bool *winch)
{
	struct pollfd pf[3] = {
	    {.fd = x->fd, .events = POLLIN},
	    {.fd = sfd, .events = POLLIN},
	    {.fd = -1, .events = POLLIN},
	};
	int wait_ms = -1, r;
	unsigned rows, cols;
	bool can_read_stdin = x->want_stdin && x->started && !x->stdin_eof_sent && !x->in_flight;

	if (*winch && x->started) {
		*winch = false;
		term_size(&rows, &cols);
		if ((r = send_req(x, json_pack("{s:s, s:s, s:i, s:i}", "id", x->id, "op", "resize", "rows", (int)rows,
					       "cols", (int)cols))) < 0)
			return r;
	}
	if (can_read_stdin && x->chunk_busy) { /* resend after the backoff */
		uint64_t t = now_ms();
		if (t >= x->retry_at_ms) {
			if ((r = send_chunk(x)) < 0)
				return r;
		} else {
			wait_ms = (int)(x->retry_at_ms - t);
		}
	} else if (can_read_stdin && !x->chunk_eof) {
		pf[2].fd = STDIN_FILENO;
	}
	if (poll(pf, 3, wait_ms) < 0) {
		if (errno == EINTR)
			return 0;
		cmd_err("%s: poll: %s", o->who, strerror(errno));
		x->status = EXEC_FAILED;
		return 1;
	}
	if (pf[1].revents & POLLIN)
		on_signals(o, x, sfd, winch);
	if (pf[2].fd >= 0 && (pf[2].revents & (POLLIN | POLLHUP | POLLERR))) {
		if ((r = read_stdin(x)) != 0)
			return r < 0 ? r : 0; /* interrupted: round again */
	}
	if (pf[0].revents & (POLLIN | POLLHUP | POLLERR))
		return read_relay(o, x) < 0 ? 1 : 0;
	return 0;
}

/* The guest's PATH for a command run from rel, asked with a second
 * command in tail mode; "(unknown: ...)" when that fails too. */
static void guest_path(const char *sock, const char *rel, char *out, size_t n)
{
	struct xc q = {.fd = -1};
	json_t *req, *ev = NULL;
	const char *s;

	snprintf(out, n, "(unknown: the guest did not say)");
	if ((q.fd = cmd_connect_relay(sock)) < 0)
		return;
	snprintf(q.id, sizeof(q.id), "airlock-path-%d-%08x", (int)getpid(), randombytes_random());
	req = json_pack("{s:s, s:s, s:[s, s, s], s:s, s:b, s:f}", "id", q.id, "op", "exec", "argv", "sh", "-c",
			"printf %s \"$PATH\"", "cwd", rel, "tail", 1, "timeout_seconds", 10.0);
	if (send_req(&q, req) == 0) {
		FILE *f = fdopen(q.fd, "r");
		char line[8192];
		if (f) {
			q.fd = -1;
			while (fgets(line, sizeof(line), f)) {
				ev = json_loads(line, 0, NULL);
				s = json_string_value(json_object_get(ev, "event"));
				if (s && !strcmp(s, "result") && json_integer_value(json_object_get(ev, "code")) == 0 &&
				    (s = json_string_value(json_object_get(ev, "stdout"))) && *s) {
					snprintf(out, n, "%s", s);
					break;
				}
				if (s && (!strcmp(s, "result") || !strcmp(s, "error")))
					break;
				json_decref(ev);
				ev = NULL;
			}
			fclose(f);
		}
	}
	json_decref(ev);
	if (q.fd >= 0)
		close(q.fd);
}

/* Exits that would say nothing otherwise: the timeout (124) and a command
 * not found in the sandbox (127) get one line naming the cause and the fix. */
static void explain_exit(const struct run_opts *o, const struct xc *x, const char *real, const char *rel)
{
	char sock[PATH_MAX], path[4096];

	if (x->timed_out && o->timeout > 0)
		cmd_err("%s: '%s' timed out after %.1f s and was killed (exit 124): the limit is --timeout %g; "
			"raise it there",
			o->who, o->argv[0], x->duration_ms / 1000.0, o->timeout);
	else if (x->timed_out)
		cmd_err("%s: '%s' timed out after %.1f s and was killed (exit 124): the limit is the policy's "
			"execution.timeout_seconds (300 unless airlock.json sets it); raise it there or with "
			"--timeout S",
			o->who, o->argv[0], x->duration_ms / 1000.0);
	if (x->status != 127 || x->timed_out || relay_default_path(real, sock, sizeof(sock)) < 0)
		return;
	guest_path(sock, rel, path, sizeof(path));
	cmd_err("%s: exit 127: '%s' (or a command it ran) was not found in the sandbox; its PATH there is %s "
		"(install it in the sandbox, or give its full path)",
		o->who, o->argc >= 3 && !strcmp(o->argv[0], "sh") ? o->argv[2] : o->argv[0], path);
}

/*
 * The guard, for a relay of protocol 2 only (newer ones take
 * "cancel_on_close" and need no process of ours): a child in its own
 * session holds the read end of a pipe; when we end without saying we
 * are done (a byte), it sees end of file and cancels the command over its
 * own connection. -1 when there is no guard (the command runs anyway).
 */
static int guard_start(const struct xc *x, pid_t *pid)
{
	int p[2];
	char c;

	if (pipe2(p, O_CLOEXEC) < 0)
		return -1;
	if ((*pid = fork()) < 0) {
		close(p[0]);
		close(p[1]);
		return -1;
	}
	if (*pid == 0) {
		int null = open("/dev/null", O_RDWR | O_CLOEXEC);
		close(p[1]);
		close(x->fd); /* the connection is the parent's: let it close when the parent ends */
		for (int fd = 0; fd < 3 && null >= 0; fd++)
			dup2(null, fd); /* nor hold the output pipes of whoever started us */
		setsid();
		ssize_t n;
		while ((n = read(p[0], &c, 1)) < 0 && errno == EINTR)
			;
		if (n == 0) { /* our parent ended without a word */
			char line[160];
			int fd = cmd_connect_relay(x->sock);
			int k = snprintf(line, sizeof(line), "{\"id\":\"%s\",\"op\":\"cancel\"}\n", x->id);
			if (fd >= 0 && k > 0 && (size_t)k < sizeof(line) && io_write_all(fd, line, (size_t)k) == 0)
				while (read(fd, line, sizeof(line)) < 0 && errno == EINTR) /* the hello: it was read */
					;
		}
		_exit(0);
	}
	close(p[0]);
	return p[1];
}

/* Tell the guard we are done. It is not waited for: that waited until it
 * was scheduled, read the byte and exited, a scheduler round trip at the
 * end of every command (milliseconds on a loaded machine). It holds none
 * of our caller's descriptors (guard_start), so nothing waits on it; once
 * we exit, init (or the caller's subreaper) reaps it. */
static void guard_stop(int fd, pid_t pid)
{
	if (fd < 0)
		return;
	(void)!write(fd, "x", 1);
	close(fd);
	while (waitpid(pid, NULL, WNOHANG) < 0 && errno == EINTR)
		;
}

/* Build and send the exec request. 0, or -1 after saying why. */
static int send_exec(const struct run_opts *o, struct xc *x, const char *rel)
{
	json_t *req;
	int r;

	if ((r = exec_request(o, x, rel, &req)) < 0) {
		if (r == -EILSEQ)
			cmd_err("%s: arguments must be valid UTF-8", o->who);
		else
			cmd_err("%s: out of memory", o->who);
		return -1;
	}
	if ((r = send_req(x, req)) < 0) {
		cmd_err("%s: sending the request: %s", o->who, strerror(-r));
		return -1;
	}
	return 0;
}

/* Run one command through the relay and return the exit status to use. */
static int run_remote(const struct run_opts *o)
{
	static struct xc x;
	static struct shell_cwd cwd;
	char real[PATH_MAX];
	const char *rel = "";
	int r, sfd = -1, guard = -1;
	pid_t guard_pid = -1;
	bool winch = false; /* a resize to send once the command has started */

	memset(&x, 0, sizeof(x));
	x.fd = -1;
	x.backoff_ms = 1;
	if (o->cwd_file) {
		shell_cwd_init(&cwd);
		x.cwd = &cwd;
	}
	x.want_stdin =
	    o->stdin_mode == 1 || (o->stdin_mode == -1 && (o->tty || (!isatty(STDIN_FILENO) && !stdin_is_null())));
	if (connect_workspace(o, &x, real, &rel) < 0)
		return EXEC_FAILED;
	snprintf(x.id, sizeof(x.id), "airlock-%s-%d-%08x", o->who, (int)getpid(), randombytes_random());
	buf_init(&x.in, IN_MAX);
	x.status = EXEC_FAILED;
	x.cancel_on_close = true;
	if ((sfd = take_signals(o)) < 0 || send_exec(o, &x, rel) < 0)
		goto out;
	x.status = 0;
	if (o->tty)
		term_raw(STDIN_FILENO); /* keys (^C, ^Z, ^D) go to the guest's terminal as bytes */
	while (!x.done && (r = run_once(o, &x, sfd, &winch)) == 0) {
		if (!x.old_relay)
			continue;
		x.old_relay = x.cancel_on_close = false; /* a relay of protocol 2: the guard's way */
		if (send_exec(o, &x, rel) < 0) {
			x.status = EXEC_FAILED;
			break;
		}
		guard = guard_start(&x, &guard_pid);
	}
	if (r < 0) {
		term_restore();
		cmd_err("%s: writing to the relay: %s", o->who, strerror(-r));
		x.status = EXEC_FAILED;
	}
	term_restore();
	if (x.done)
		explain_exit(o, &x, real, rel);
	if (x.cwd) {
		shell_cwd_flush(x.cwd, STDERR_FILENO);
		if (x.status == 0) {
			if (*rel)
				real[rel - real - 1] = '\0'; /* the workspace root */
			shell_cwd_write(x.cwd, real, o->cwd_file);
		}
	}
out:
	guard_stop(guard, guard_pid);
	term_restore();
	buf_clear(&x.in);
	if (x.fd >= 0)
		close(x.fd);
	if (sfd >= 0)
		close(sfd);
	return x.status;
}

/* An option getopt did not know, named with our prefix (getopt's own
 * message would carry the subcommand as the program name). */
static void bad_option(const char *who, char **argv)
{
	if (optopt && optopt != '?')
		cmd_err("%s: unknown option '-%c' (or it needs an argument)", who, optopt);
	else
		cmd_err("%s: unknown option '%s'", who, argv[optind - 1]);
}

static bool parse_timeout(const char *who, const char *arg, double *out)
{
	char *end;

	*out = strtod(arg, &end);
	if (*end || !(*out > 0) || *out > 30 * 86400) {
		cmd_err("%s: --timeout '%s': a number of seconds > 0 and at most 30 days", who, arg);
		return false;
	}
	return true;
}

int cmd_exec(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"timeout", required_argument, NULL, 't'}, {"stdin", no_argument, NULL, 'i'},
	    {"no-stdin", no_argument, NULL, 'n'},      {"tty", no_argument, NULL, 'T'},
	    {"fork", required_argument, NULL, 'F'},    {NULL, 0, NULL, 0},
	};
	struct run_opts o = {.who = "exec", .dir = ".", .stdin_mode = -1};
	int c;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "+C:", opts, NULL)) != -1) {
		switch (c) {
		case 'C':
			o.dir = optarg;
			break;
		case 't':
			if (!parse_timeout("exec", optarg, &o.timeout))
				return 2;
			break;
		case 'i':
			o.stdin_mode = 1;
			break;
		case 'n':
			o.stdin_mode = 0;
			break;
		case 'T':
			o.tty = true;
			break;
		case 'F':
			if (!relay_fork_name_ok(optarg)) {
				cmd_err("exec: --fork '%.40s': not a fork's name (1 to %d of a-z, 0-9, '-' and '_')",
					optarg, RELAY_FORK_NAME_MAX);
				return 2;
			}
			o.fork = optarg;
			break;
		default:
			bad_option("exec", argv);
			exec_usage();
			return 2;
		}
	}
	if (optind >= argc) {
		cmd_err("exec: missing the command to run (airlock exec -- CMD [ARG...])");
		exec_usage();
		return 2;
	}
	o.argv = argv + optind;
	o.argc = argc - optind;
	return run_remote(&o);
}

/*
 * airlock shell [-C DIR] [--timeout S] [--bash] [-l|--login] [-i] [-c CMD [NAME [ARG...]]]
 *
 * Without -c: an interactive login shell in the sandbox, bash when the
 * guest has it (or always with --bash), else sh, on a pty when our stdin is
 * a terminal. It is interactive, so its timeout defaults to the longest
 * the relay allows rather than the policy's per-command default.
 *
 * With -c: CMD is one shell command string, run by the guest's sh -c (bash
 * -c with --bash; NAME and ARGs become $0, $1, ... as with sh -c), on a pty
 * only when our stdin and stdout are both terminals; the exit status is
 * CMD's. This is what makes airlock usable wherever a tool takes a shell
 * path and runs "SHELL -c STRING" (doc/EDITORS.md). -l, --login and -i are
 * accepted and ignored, for tools that pass them to every shell (a login
 * shell's profile is the host's business: the guest's environment is the
 * policy's). With --bash, bash's own set options (-e -u -x -v -f -o NAME,
 * -O NAME) are passed to the guest's bash, and --norc, --noprofile
 * are accepted and ignored, so a wrapper named bash takes what tools pass.
 *
 * --cwd-file FILE (implies --bash): when CMD exits 0, the directory it ended
 * in, as the host path of the same directory of the mount, is written to
 * FILE: Claude Code's cwd file (shell_cwd_i.h, doc/EDITORS.md).
 */
#define LOGIN_SHELL	  "if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l"
#define SHELL_TIMEOUT_MAX (30.0 * 86400)
#define SHELL_ARGV_MAX	  64

/* Our stdout and stderr are one file that is not a terminal (a tool that
 * reads a command's output as one stream, in the order it was written):
 * then the guest's bash writes both to one pipe too, and the relay keeps
 * that order (two pipes have none between them). */
static bool output_merged(void)
{
	struct stat a, b;

	return fstat(STDOUT_FILENO, &a) == 0 && fstat(STDERR_FILENO, &b) == 0 && a.st_dev == b.st_dev &&
	       a.st_ino == b.st_ino && !isatty(STDOUT_FILENO);
}

/* Append one word to the guest argv; false when it is full. */
static bool sh_push(char **sh, int *n, const char *w)
{
	if (*n >= SHELL_ARGV_MAX - 1)
		return false;
	sh[(*n)++] = (char *)w;
	return true;
}

int cmd_shell(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"timeout", required_argument, NULL, 't'},	{"bash", no_argument, NULL, 'B'},
	    {"login", no_argument, NULL, 'l'},		{"interactive", no_argument, NULL, 'i'},
	    {"norc", no_argument, NULL, 'N'},		{"noprofile", no_argument, NULL, 'N'},
	    {"cwd-file", required_argument, NULL, 'W'}, {NULL, 0, NULL, 0},
	};
	struct run_opts o = {.who = "shell", .dir = ".", .stdin_mode = -1};
	const char *cmd = NULL;
	char *sh[SHELL_ARGV_MAX], *setopts[SHELL_ARGV_MAX];
	int c, n = 0, nset = 0;
	bool bash = false, ok = true;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "+C:c:lieuxvfo:O:", opts, NULL)) != -1) {
		switch (c) {
		case 'C':
			o.dir = optarg;
			break;
		case 't':
			if (!parse_timeout("shell", optarg, &o.timeout))
				return 2;
			break;
		case 'c':
			cmd = optarg;
			break;
		case 'B':
			bash = true;
			break;
		case 'W':
			o.cwd_file = optarg;
			bash = true;
			break;
		case 'l':
		case 'i':
		case 'N':
			break;
		case 'e':
		case 'u':
		case 'x':
		case 'v':
		case 'f':
		case 'o':
		case 'O': {
			/* bash's set options, for the guest's bash (refused below without --bash) */
			static const char *const flag[128] = {['e'] = "-e", ['u'] = "-u", ['x'] = "-x", ['v'] = "-v",
							      ['f'] = "-f", ['o'] = "-o", ['O'] = "-O"};
			ok = ok && nset + 2 < SHELL_ARGV_MAX;
			if (ok) {
				setopts[nset++] = (char *)flag[c];
				if (c == 'o' || c == 'O')
					setopts[nset++] = optarg;
			}
			break;
		}
		default:
			bad_option("shell", argv);
			shell_usage();
			return 2;
		}
	}
	if (nset && !bash) {
		cmd_err("shell: '%s' is an option of bash: add --bash (sh -c takes no options here)", setopts[0]);
		return 2;
	}
	ok = ok && sh_push(sh, &n, bash ? "bash" : "sh");
	for (int i = 0; i < nset; i++)
		ok = ok && sh_push(sh, &n, setopts[i]);
	if (o.cwd_file && (!cmd || optind < argc)) {
		cmd_err("shell: --cwd-file needs -c CMD, and no NAME or ARGs after it");
		return 2;
	}
	char *merged = NULL;
	if (cmd && output_merged()) {
		if (!(merged = mem_alloc(strlen(cmd) + sizeof("exec 2>&1\n")))) {
			cmd_err("shell: out of memory");
			return 2;
		}
		strcpy(merged, "exec 2>&1\n");
		strcat(merged, cmd);
		cmd = merged;
	}
	if (o.cwd_file) {
		ok = ok && sh_push(sh, &n, "-c") && sh_push(sh, &n, SHELL_CWD_SCRIPT) &&
		     sh_push(sh, &n, "airlock-shell") && sh_push(sh, &n, cmd); /* REL and MARK follow (exec_request) */
		o.tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
	} else if (cmd) {
		ok = ok && sh_push(sh, &n, "-c") && sh_push(sh, &n, cmd);
		for (int i = optind; i < argc; i++)
			ok = ok && sh_push(sh, &n, argv[i]);
		o.tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
	} else {
		if (optind < argc) {
			shell_usage();
			return 2;
		}
		if (bash)
			ok = ok && sh_push(sh, &n, "-l");
		else
			ok = ok && sh_push(sh, &n, "-c") && sh_push(sh, &n, LOGIN_SHELL);
		o.tty = isatty(STDIN_FILENO);
		if (!o.timeout)
			o.timeout = SHELL_TIMEOUT_MAX;
	}
	if (!ok) {
		cmd_err("shell: at most %d words for the guest's shell", SHELL_ARGV_MAX - 1);
		mem_free(merged);
		return 2;
	}
	sh[n] = NULL;
	o.argv = sh;
	o.argc = n;
	int st = run_remote(&o);
	mem_free(merged);
	return st;
}
