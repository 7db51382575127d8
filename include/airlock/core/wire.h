/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_WIRE_H
#define AIRLOCK_WIRE_H

/*
 * wire: the airlock host <-> guest protocol, in one place.
 * doc/PROTOCOL.md is the prose version of this header; keep them together.
 *
 *     CHANGE WIRE_VERSION IF YOU CHANGE ANYTHING IN THIS FILE THAT
 *     AFFECTS BYTES ON THE WIRE. There is no negotiation: the version is
 *     part of the Noise prologue, so peers of different versions fail the
 *     handshake (and the plaintext version byte lets them say why).
 *
 * Layers, outermost first:
 *   record   4-byte header (24-bit length + check byte, see below), then
 *            that many bytes. Every byte on the
 *            connection belongs to a record. The length is checked against
 *            WIRE_RECORD_MAX (or WIRE_HS_MSG_MAX during the handshake)
 *            before anything is allocated.
 *   handshake  three records: initiator's msg1, responder's msg2 (or a
 *            refusal), then each side's secretstream header.
 *   transport  every later record is one crypto_secretstream_xchacha20poly1305
 *            message; its plaintext is one frame.
 *   frame    u8 type, u32 stream id, payload (the rest of the record).
 *            A record whose plaintext is shorter than the 5-byte frame
 *            header is a protocol error; an unknown type is not.
 */

#include <stddef.h>
#include <stdint.h>

#define WIRE_VERSION 2
/* Noise prologue: binds the protocol name and version into the handshake
 * hash, so nothing about the version can be downgraded. */
#define WIRE_PROLOGUE	"airlock wire v1"
#define WIRE_NOISE_NAME "Noise_IKpsk2_25519_ChaChaPoly_SHA256"

/* ---- record layer ----
 * The 4-byte record header is big-endian (check << 24 | length) with
 * length < 2^24 and check = WIRE_HDR_MAGIC ^ the three length bytes. The
 * bytes that follow are authenticated by the AEAD anyway; the check byte
 * makes a damaged header an immediate error instead of a receiver waiting
 * for bytes that never come (a flipped length bit on a serial line). */
#define WIRE_LEN_BYTES 4
#define WIRE_HDR_MAGIC 0xa7u

static inline uint32_t wire_record_hdr(uint32_t len)
{
	uint32_t check = WIRE_HDR_MAGIC ^ ((len >> 16) & 0xff) ^ ((len >> 8) & 0xff) ^ (len & 0xff);
	return (check << 24) | (len & 0xffffffu);
}

/* 0 and *len on a well-formed header, -1 when the check byte is wrong. */
static inline int wire_record_len(uint32_t hdr, uint32_t *len)
{
	*len = hdr & 0xffffffu;
	return wire_record_hdr(*len) == hdr ? 0 : -1;
}

#define WIRE_HS_MSG_MAX	 256u	       /* handshake records */
#define WIRE_FRAME_HDR	 5u	       /* u8 type + u32 stream */
#define WIRE_PAYLOAD_MAX (64u * 1024u) /* frame payload cap */
#define WIRE_SS_ABYTES	 17u	       /* crypto_secretstream ABYTES */
#define WIRE_SS_HEADER	 24u	       /* crypto_secretstream HEADERBYTES */
#define WIRE_RECORD_MAX	 (WIRE_FRAME_HDR + WIRE_PAYLOAD_MAX + WIRE_SS_ABYTES)

/* ---- handshake records ----
 * msg1  = u8 WIRE_HS_INIT, u8 WIRE_VERSION, Noise message 1
 *         (e, es, s, ss; payload = 12-byte TAI64N timestamp)
 * msg2  = u8 WIRE_HS_RESP, Noise message 2 (e, ee, se, psk; empty payload)
 * refuse= u8 WIRE_HS_REFUSE, u8 reason (enum wire_refusal). Unauthenticated:
 *         a hint for the human, never trusted for anything else.
 * then each side sends one record holding its 24-byte secretstream header.
 */
enum wire_hs_kind {
	WIRE_HS_INIT = 0x01,
	WIRE_HS_RESP = 0x02,
	WIRE_HS_REFUSE = 0x7f,
};

enum wire_refusal {
	WIRE_REFUSE_VERSION = 1,   /* msg1 carried a version we do not speak */
	WIRE_REFUSE_GUEST_KEY = 2, /* msg1 did not decrypt: initiator pinned another responder key */
	WIRE_REFUSE_HOST_KEY = 3,  /* initiator's static key is not on our allow-list */
	WIRE_REFUSE_REPLAY = 4,	   /* msg1 timestamp not newer than the last one seen */
	WIRE_REFUSE_BUSY = 5,	   /* too many sessions */
	WIRE_REFUSE_MALFORMED = 6, /* msg1 of the wrong size or shape */
};

/* ---- streams ----
 * Stream 0 is the control stream. Initiator-opened streams are odd,
 * responder-opened streams are even and non-zero. Each data stream has a
 * credit window per direction: a sender may have at most `window` payload
 * bytes outstanding; the receiver returns credit with WIRE_WINDOW as its
 * application consumes. Sending beyond the window is a protocol error that
 * ends the connection. The control stream is not windowed; its frames are
 * small and handled at once. */
#define WIRE_STREAM_CONTROL 0u
#define WIRE_WINDOW_DEFAULT (256u * 1024u)
#define WIRE_STREAMS_MAX    4096u

/* sync: largest reassembled sync message (a batch is at most this big:
 * the host's delta caps use it as max_batch) and most names per request */
#define WIRE_SYNC_MSG_MAX (256u * 1024u * 1024u)
#define WIRE_SYNC_REQ_MAX 4096u
#define WIRE_SYNC_MORE	  1u /* first payload byte: more fragments follow */

/* exec: request limits and flag bits (see WIRE_EXEC_START / _EXIT) */
#define WIRE_EXEC_ARGS_MAX     4096u
#define WIRE_EXEC_STR_MAX      (WIRE_PAYLOAD_MAX)
#define WIRE_EXEC_STDIN_WINDOW (256u * 1024u)
#define WIRE_EXEC_F_TTY	       1u
#define WIRE_EXEC_F_STDIN      2u
/* egress in effect: the guest listens on 127.0.0.1 for this command and sets
 * the proxy variables; connections come back as proxy streams */
#define WIRE_EXEC_F_PROXY     4u
#define WIRE_EXEC_F_FWD	      8u /* EXEC_START carries the forwarded env list (credentials) */
#define WIRE_EXEC_X_TIMED_OUT 1u
#define WIRE_EXEC_X_CANCELED  2u
#define WIRE_EXEC_X_CORE      4u
/* proxy: guest-opened streams carrying one TCP connection to the host's
 * egress proxy each (see WIRE_PROXY_OPEN). At most this many streams open
 * per command and per session (the host refuses more with PROXY_CLOSE
 * WIRE_PROXY_C_LIMIT; the guest closes the extra connection itself). */
#define WIRE_PROXY_PER_CMD     32u
#define WIRE_PROXY_PER_SESSION 256u
/* PROXY_CLOSE codes */
#define WIRE_PROXY_C_DONE   0u /* orderly: EOF went both ways, everything delivered */
#define WIRE_PROXY_C_RESET  1u /* the connection failed or was aborted: reset it */
#define WIRE_PROXY_C_LIMIT  2u /* refused: too many proxy streams (per command or session) */
#define WIRE_PROXY_C_NO_CMD 3u /* refused: no such command on this session (it ended) */
#define WIRE_PROXY_C_MAX    3u

/* ---- frame types ----
 * Grouped by subsystem. Payload layouts use buf.h encodings (big-endian
 * integers, u32-length-prefixed byte strings). */
enum wire_type {
	/* channel: WINDOW and BYE are handled inside chan.c and never seen by
	 * applications; RESET is delivered (the application then forgets the
	 * stream with chan_stream_close) */
	WIRE_WINDOW = 1, /* stream 0: u32 stream, u32 credit increment */
	WIRE_BYE = 2,	 /* stream 0, sent with TAG_FINAL: orderly close */
	WIRE_RESET = 3,	 /* stream s: the sender abandons stream s */

	/* session (control stream) */
	WIRE_HELLO = 16,    /* i->r: u32 version, bytes host sync-signing key (32, Ed25519), str client name */
	WIRE_HELLO_OK = 17, /* r->i: u32 version, str agent name, str root */
	WIRE_PING = 18,	    /* u64 nonce, bytes padding: answered with PONG echoing the payload */
	WIRE_PONG = 19,
	WIRE_ERROR = 20, /* u32 code (errno), str message */

	/* bulk (benchmarks and flow-control tests) */
	WIRE_BULK_DATA = 32, /* stream s: opaque bytes, discarded by the receiver */
	WIRE_BULK_END = 33,  /* stream s: u64 total bytes sent */
	WIRE_BULK_ACK = 34,  /* stream s: u64 total bytes received */

	/* sync (48..79; doc/PROTOCOL.md "Sync"). All on one host-opened
	 * stream s. Every sync payload starts with u8 more: 1 = another
	 * fragment of the same message follows in a frame of the same type,
	 * 0 = last fragment. The receiver reassembles up to
	 * WIRE_SYNC_MSG_MAX bytes (checked before growing) and then parses the
	 * message; below, "payload" means the reassembled message. */
	WIRE_SYNC_BEGIN = 48, /* h->g: u32 chunk min, avg, max, whole_max */
	WIRE_SYNC_STATE =
	    49, /* g->h: u64 last applied seq, 16 root digest, u64 entries, u32 special files skipped, u64 generation */
	WIRE_SYNC_LEVELS_REQ = 50, /* h->g: u32 n (<= WIRE_SYNC_REQ_MAX), n x str dir ("" = root) */
	WIRE_SYNC_LEVEL = 51,	   /* g->h, one per asked dir, in order: str dir, bytes level (manifest_level_encode) */
	WIRE_SYNC_ENTRIES_REQ = 52, /* h->g: u32 n (<= WIRE_SYNC_REQ_MAX), n x str path */
	WIRE_SYNC_ENTRY = 53,	    /* g->h, one per asked path: str path, u8 found, [manifest_entry_encode] */
	WIRE_SYNC_BATCH = 54,	    /* h->g: one signed delta batch (delta.h) */
	WIRE_SYNC_ACK = 55,	    /* g->h: u64 seq, u64 ops, u64 files, u64 bytes, u64 deleted, u64 kept_dirs,
				     * [failure list: u8 version 1, u8 flags, u32 n, n x (u32 op, u32 errno,
				     * str path, str message)] */
	WIRE_SYNC_NACK = 56,	    /* g->h: u64 seq, u32 errno, u8 partial, str message */

	/* exec (80..111; doc/PROTOCOL.md "Exec"). One host-opened stream per
	 * command, created by EXEC_START; the guest ends it with exactly one
	 * EXEC_EXIT or EXEC_ERROR, after which both sides forget the stream.
	 * Output frames (g->h) count against the stream's window, which the
	 * host returns as its client consumes, so a slow reader pauses the
	 * command in the guest. Host->guest frames are credited by the guest
	 * at once; EXEC_STDIN_ACK is the stdin window (WIRE_EXEC_STDIN_WINDOW
	 * bytes in flight at most). */
	WIRE_EXEC_START = 80,	  /* h->g: u8 flags (WIRE_EXEC_F_*), u64 timeout_ms (0 = none),
				   * u16 rows, u16 cols, str cwd (relative, "" = root),
				   * u32 argc (1..WIRE_EXEC_ARGS_MAX), argc x str,
				   * u32 nenv (<= WIRE_EXEC_ARGS_MAX), nenv x str "NAME=value";
				   * with WIRE_EXEC_F_FWD then u32 nfwd (<= WIRE_EXEC_ARGS_MAX),
				   * nfwd x str "NAME=value": the forwarded layer (forward_env
				   * and credentials.inject values; the request env wins over
				   * it; the guest wipes it after use);
				   * the whole request fits one frame (WIRE_PAYLOAD_MAX) */
	WIRE_EXEC_STARTED = 81,	  /* g->h: u64 pid (in the guest) */
	WIRE_EXEC_STDOUT = 82,	  /* g->h: raw bytes (with a tty: the terminal's output) */
	WIRE_EXEC_STDERR = 83,	  /* g->h: raw bytes */
	WIRE_EXEC_STDIN = 84,	  /* h->g: u8 eof, raw bytes (the rest of the frame) */
	WIRE_EXEC_SIGNAL = 85,	  /* h->g: u32 signal (Linux numbering) to the process group */
	WIRE_EXEC_RESIZE = 86,	  /* h->g: u16 rows, u16 cols (tty only) */
	WIRE_EXEC_CANCEL = 87,	  /* h->g: empty; TERM, grace, KILL on the tree */
	WIRE_EXEC_EXIT = 88,	  /* g->h: u32 code (0..255, shell convention: 128+N on signal N),
				   * u32 signal (0 = exited), u8 flags (WIRE_EXEC_X_*),
				   * u64 duration_ms, u64 stdout bytes, u64 stderr bytes. Last frame. */
	WIRE_EXEC_ERROR = 89,	  /* g->h: u32 errno, str message: the command could not start
				   * (or was dropped); last frame of the stream */
	WIRE_EXEC_STDIN_ACK = 90, /* g->h: u32 stdin bytes taken off the stream (returns stdin credit) */

	/* proxy (112..127; doc/PROTOCOL.md "Proxy"). One guest-opened (even)
	 * stream p per TCP connection a command makes to the proxy listener
	 * the guest opened for it (WIRE_EXEC_F_PROXY). Both directions are
	 * windowed by p's credit; the receiver returns credit as it writes the
	 * bytes to its socket, so a slow reader on either end stalls only p.
	 * Each side sends exactly one PROXY_CLOSE as its last frame on p and
	 * forgets p once it has sent and received one. */
	WIRE_PROXY_OPEN = 112,	/* g->h, first frame on p: u32 exec stream of the command it belongs to */
	WIRE_PROXY_DATA = 113,	/* both: raw bytes (1..WIRE_PAYLOAD_MAX) */
	WIRE_PROXY_EOF = 114,	/* both: empty; the sender sends no more DATA (half-close) */
	WIRE_PROXY_CLOSE = 115, /* both: u8 code (WIRE_PROXY_C_*); the sender's last frame on p */

	/* changes (128..143; doc/PROTOCOL.md "Changes"): what commands changed
	 * in the guest's copy, and the bytes the host pulls back to review or
	 * write them. */
	WIRE_CHG_ITEM = 128, /* g->h, on a command's exec stream before its EXEC_EXIT: one changed
			      * path (wire_chg_item), by = the exec stream of the command that made it */
	WIRE_CHG_PULL = 129, /* h->g, first frame on a host-opened stream: u32 n (<= WIRE_SYNC_REQ_MAX),
			      * n x str path (the wire_sync_req layout) */
	WIRE_CHG_FILE = 130, /* g->h, one per asked path in order: wire_chg_item (by 0); a file's
			      * size bytes follow in CHG_DATA frames */
	WIRE_CHG_DATA = 131, /* g->h: raw bytes (1..WIRE_PAYLOAD_MAX) of the last CHG_FILE */
	WIRE_CHG_END = 132,  /* g->h: u32 errno (0 = every path answered), str message; last frame */
	WIRE_TYPE_MAX = 255,
};

/* ---- type ranges ----
 * Each subsystem owns a range of type numbers; a receiver routes a frame by
 * its group (wire_group_of) before it looks at the type. */
#define WIRE_CHAN_FIRST	   1u
#define WIRE_CHAN_LAST	   15u
#define WIRE_SESSION_FIRST 16u
#define WIRE_SESSION_LAST  31u
#define WIRE_BULK_FIRST	   32u
#define WIRE_BULK_LAST	   47u
#define WIRE_SYNC_FIRST	   48u
#define WIRE_SYNC_LAST	   79u
#define WIRE_EXEC_FIRST	   80u
#define WIRE_EXEC_LAST	   111u
#define WIRE_PROXY_FIRST   112u
#define WIRE_PROXY_LAST	   127u
#define WIRE_CHANGES_FIRST 128u
#define WIRE_CHANGES_LAST  143u

enum wire_group {
	WIRE_GROUP_NONE = 0, /* 0 and 144..255: unassigned */
	WIRE_GROUP_CHAN,
	WIRE_GROUP_SESSION,
	WIRE_GROUP_BULK,
	WIRE_GROUP_SYNC,
	WIRE_GROUP_EXEC,
	WIRE_GROUP_PROXY,
	WIRE_GROUP_CHANGES,
};

/* The subsystem a frame type belongs to (by range, assigned or not). */
enum wire_group wire_group_of(uint8_t type);

/* Name of a frame type for logs ("SYNC_BEGIN" for WIRE_SYNC_BEGIN);
 * "UNKNOWN" for unassigned numbers. The one table of names: dispatch
 * tables log through it. */
const char *wire_type_name(uint8_t type);
/* Human text for a refusal reason. */
const char *wire_refusal_str(uint8_t reason);

/* ---- payload codecs ----
 * One encode/decode pair per structured payload, used by both ends
 * (doc/PROTOCOL.md names them next to each message):
 *
 *   int wire_<msg>_encode(struct buf *b, const struct wire_<msg> *m);
 *       Appends the payload to b. 0, -errno from the buffer (-ENOBUFS when
 *       it does not fit b's cap), or -E2BIG / -EINVAL when m breaks a limit
 *       the decoder would refuse (so we never send what the peer rejects).
 *   int wire_<msg>_decode(struct buf *in, struct wire_<msg> *m);
 *       Parses the whole readable region of `in` (a payload, or a
 *       reassembled sync message). 0, or -EBADMSG when it is malformed:
 *       short, a count or length over its limit (checked before anything
 *       is allocated), a value out of range, or bytes left over; -EPROTO
 *       where a field names another protocol version; -ENOMEM. On failure
 *       m holds nothing (every pointer NULL) and nothing stays allocated.
 *   void wire_<msg>_clear(struct wire_<msg> *m);
 *       For messages whose decode allocates: frees what it returned and
 *       zeroes m. NULL pointers inside m are fine (safe after a failure
 *       and twice).
 *
 * Ownership: `char *` fields a decoder fills are NUL-terminated copies
 * from mem_alloc (embedded NUL bytes are refused), freed by _clear.
 * `const uint8_t *` fields are views into in's bytes, valid while those
 * bytes are. Encoders only read m.
 *
 * Payloads without structure have no codec: BYE, RESET, BULK_DATA,
 * EXEC_STDOUT/STDERR, EXEC_CANCEL (empty), PROXY_DATA, PROXY_EOF (empty)
 * and SYNC_BATCH (delta.h has its own codec). PONG echoes PING. */
struct buf;

/* string limits of the decoders (bytes, without the NUL) */
#define WIRE_NAME_MAX	   256u	 /* HELLO client, HELLO_OK agent name */
#define WIRE_PATH_MAX	   4096u /* HELLO_OK root, sync dirs and paths (= MANIFEST_PATH_MAX) */
#define WIRE_ERROR_MSG_MAX 1024u /* ERROR, EXEC_ERROR message */
#define WIRE_NACK_MSG_MAX  4096u /* SYNC_NACK message */
#define WIRE_SYNC_HASH_LEN 16u	 /* SYNC_STATE root digest (= CHUNK_HASH_LEN) */

/* WINDOW (stream 0): credit for stream `stream` (never 0). */
struct wire_window {
	uint32_t stream;
	uint32_t credit;
};
int wire_window_encode(struct buf *b, const struct wire_window *m);
int wire_window_decode(struct buf *in, struct wire_window *m);

/* HELLO: u32 WIRE_VERSION (another version: -EPROTO), the host's 32-byte
 * Ed25519 sync-signing key (another length: -EPROTO, over 32: -EBADMSG),
 * the client's name (<= WIRE_NAME_MAX). */
struct wire_hello {
	uint8_t sign_pk[32];
	char *client;
};
int wire_hello_encode(struct buf *b, const struct wire_hello *m);
int wire_hello_decode(struct buf *in, struct wire_hello *m);
void wire_hello_clear(struct wire_hello *m);

/* HELLO_OK: u32 WIRE_VERSION (another version: -EPROTO), agent name
 * (<= WIRE_NAME_MAX), the guest's root (<= WIRE_PATH_MAX). */
struct wire_hello_ok {
	char *agent;
	char *root;
};
int wire_hello_ok_encode(struct buf *b, const struct wire_hello_ok *m);
int wire_hello_ok_decode(struct buf *in, struct wire_hello_ok *m);
void wire_hello_ok_clear(struct wire_hello_ok *m);

/* PING (and PONG, which echoes it byte for byte): u64 nonce, bytes padding. */
struct wire_ping {
	uint64_t nonce;
	const uint8_t *pad; /* view */
	size_t pad_len;	    /* <= WIRE_PAYLOAD_MAX */
};
int wire_ping_encode(struct buf *b, const struct wire_ping *m);
int wire_ping_decode(struct buf *in, struct wire_ping *m);

/* ERROR and EXEC_ERROR: u32 errno, str message (<= WIRE_ERROR_MSG_MAX). */
struct wire_error {
	uint32_t code;
	char *msg;
};
int wire_error_encode(struct buf *b, const struct wire_error *m);
int wire_error_decode(struct buf *in, struct wire_error *m);
void wire_error_clear(struct wire_error *m);

/* BULK_END (bytes sent) and BULK_ACK (bytes received): u64. */
struct wire_bulk {
	uint64_t bytes;
};
int wire_bulk_encode(struct buf *b, const struct wire_bulk *m);
int wire_bulk_decode(struct buf *in, struct wire_bulk *m);

/* SYNC_BEGIN: the host's chunking parameters (chunk_params_check is the
 * receiver's; the codec checks only the layout). */
struct wire_sync_begin {
	uint32_t min, avg, max, whole_max;
};
int wire_sync_begin_encode(struct buf *b, const struct wire_sync_begin *m);
int wire_sync_begin_decode(struct buf *in, struct wire_sync_begin *m);

/* SYNC_STATE: last applied seq, root digest, entries, special files skipped,
 * the copy's generation. */
struct wire_sync_state {
	uint64_t seq;
	uint8_t root[WIRE_SYNC_HASH_LEN];
	uint64_t entries;
	uint32_t special;
	/* the copy's generation: random, new whenever the guest's state
	 * starts over or finds its copy replaced (doc/SYNC.md "Generations") */
	uint64_t gen;
};
int wire_sync_state_encode(struct buf *b, const struct wire_sync_state *m);
int wire_sync_state_decode(struct buf *in, struct wire_sync_state *m);

/* SYNC_LEVELS_REQ (dirs, "" = root) and SYNC_ENTRIES_REQ (paths): u32 n
 * (<= WIRE_SYNC_REQ_MAX, and at most one per 4 bytes left), n x str
 * (<= WIRE_PATH_MAX each). */
struct wire_sync_req {
	uint32_t n;
	char **names; /* n strings (decode: NULL-terminated array, each mem_alloc'd) */
};
int wire_sync_req_encode(struct buf *b, const struct wire_sync_req *m);
int wire_sync_req_decode(struct buf *in, struct wire_sync_req *m);
void wire_sync_req_clear(struct wire_sync_req *m);

/* SYNC_LEVEL: str dir (<= WIRE_PATH_MAX), bytes level (manifest_level_encode). */
struct wire_sync_level {
	char *dir;
	const uint8_t *level; /* view */
	size_t level_len;     /* <= WIRE_SYNC_MSG_MAX */
};
int wire_sync_level_encode(struct buf *b, const struct wire_sync_level *m);
int wire_sync_level_decode(struct buf *in, struct wire_sync_level *m);
void wire_sync_level_clear(struct wire_sync_level *m);

/* SYNC_ENTRY: str path (<= WIRE_PATH_MAX), u8 found, then when found the
 * rest of the message is one manifest_entry_encode (not found: nothing). */
struct wire_sync_entry {
	char *path;
	uint8_t found;	      /* as sent: nonzero = found */
	const uint8_t *entry; /* view: the manifest entry bytes */
	size_t entry_len;
};
int wire_sync_entry_encode(struct buf *b, const struct wire_sync_entry *m);
int wire_sync_entry_decode(struct buf *in, struct wire_sync_entry *m);
void wire_sync_entry_clear(struct wire_sync_entry *m);

/* CHG_ITEM and CHG_FILE: str path (<= WIRE_PATH_MAX), u32 st_mode (the
 * guest's lstat mode, type and every bit; 0 = the path is gone), u32 by
 * (exec stream, 0 = none), u8 flags (WIRE_CHG_F_*), u64 size, 16 hash
 * (content hash as in manifests, zero unless HASHED), str target (the
 * symlink target, <= WIRE_PATH_MAX; empty for everything else). A gone
 * path has size 0, no flags, a zero hash and no target. */
#define WIRE_CHG_F_HASHED 0x01u /* hash is the content's (files: not over the guest's hash cap) */
struct wire_chg_item {
	char *path;
	uint32_t st_mode;
	uint32_t by;
	uint8_t flags;
	uint64_t size;
	uint8_t hash[WIRE_SYNC_HASH_LEN];
	char *target;
};
int wire_chg_item_encode(struct buf *b, const struct wire_chg_item *m);
int wire_chg_item_decode(struct buf *in, struct wire_chg_item *m);
void wire_chg_item_clear(struct wire_chg_item *m);

/* SYNC_ACK: the batch applied, and what it did; with the ops that failed
 * on their own (apply.h "Per-op failures") as a trailing failure list.
 * An ACK without the list (an agent before it, or no failure) is the six
 * u64 alone; the list is sent only when something failed, and its own
 * version byte says its layout (another version: -EPROTO). Entries in
 * strictly increasing op order, errno 1..4095, n <= WIRE_SYNC_FAIL_MAX (checked
 * before anything is allocated), n > 0 unless MORE is set. Whether each
 * op index and path is one the batch had is the host engine's check. */
#define WIRE_SYNC_FAILV	       1u    /* version of the failure list */
#define WIRE_SYNC_FAIL_MAX     1024u /* entries (= APPLY_FAIL_MAX) */
#define WIRE_SYNC_FAIL_MSG_MAX 255u  /* an entry's message (= APPLY_FAIL_MSG_MAX) */
#define WIRE_SYNC_FAIL_F_MORE  0x1u  /* more ops failed than are listed */
struct wire_sync_fail {
	uint32_t op;   /* index in the batch */
	uint32_t code; /* errno */
	char *path;    /* the op's path (<= WIRE_PATH_MAX) */
	char *msg;     /* <= WIRE_SYNC_FAIL_MSG_MAX */
};
struct wire_sync_ack {
	uint64_t seq, ops, files, bytes, deleted, kept_dirs;
	uint8_t fail_flags; /* WIRE_SYNC_FAIL_F_* */
	uint32_t nfail;
	struct wire_sync_fail *fail; /* nfail entries; decode: owned, freed by _clear */
};
int wire_sync_ack_encode(struct buf *b, const struct wire_sync_ack *m);
int wire_sync_ack_decode(struct buf *in, struct wire_sync_ack *m);
void wire_sync_ack_clear(struct wire_sync_ack *m);

/* SYNC_NACK: u64 seq, u32 errno, u8 partial, str message (<= WIRE_NACK_MSG_MAX). */
struct wire_sync_nack {
	uint64_t seq;
	uint32_t code;
	uint8_t partial; /* as sent: nonzero = part of the batch was applied */
	char *msg;
};
int wire_sync_nack_encode(struct buf *b, const struct wire_sync_nack *m);
int wire_sync_nack_decode(struct buf *in, struct wire_sync_nack *m);
void wire_sync_nack_clear(struct wire_sync_nack *m);

/* EXEC_START (layout at WIRE_EXEC_START). argc 1..WIRE_EXEC_ARGS_MAX,
 * nenv and nfwd <= WIRE_EXEC_ARGS_MAX (encode: -E2BIG), every string
 * <= WIRE_EXEC_STR_MAX; the forwarded list is on the wire exactly when
 * flags has WIRE_EXEC_F_FWD (decode: nfwd = 0, fwd NULL without it). env
 * and fwd may hold credentials: wire_exec_start_clear wipes every string
 * before freeing it; the caller wipes the payload bytes it decoded from. */
struct wire_exec_start {
	uint8_t flags; /* WIRE_EXEC_F_* */
	uint64_t timeout_ms;
	uint16_t rows, cols;
	char *cwd;
	uint32_t argc, nenv, nfwd;
	char **argv; /* decode: NULL-terminated */
	char **env;  /* decode: NULL-terminated, "NAME=value" */
	char **fwd;  /* decode: NULL-terminated, "NAME=value" */
};
int wire_exec_start_encode(struct buf *b, const struct wire_exec_start *m);
int wire_exec_start_decode(struct buf *in, struct wire_exec_start *m);
void wire_exec_start_clear(struct wire_exec_start *m);

/* EXEC_STARTED: u64 pid in the guest (<= INT32_MAX). */
struct wire_exec_started {
	uint64_t pid;
};
int wire_exec_started_encode(struct buf *b, const struct wire_exec_started *m);
int wire_exec_started_decode(struct buf *in, struct wire_exec_started *m);

/* EXEC_STDIN: u8 eof, then the bytes (the rest of the frame). */
struct wire_exec_stdin {
	uint8_t eof;	     /* as sent: nonzero = no more stdin after these bytes */
	const uint8_t *data; /* view */
	size_t len;
};
int wire_exec_stdin_encode(struct buf *b, const struct wire_exec_stdin *m);
int wire_exec_stdin_decode(struct buf *in, struct wire_exec_stdin *m);

/* EXEC_SIGNAL: u32 signal, 1..64 (encode: -EINVAL). */
struct wire_exec_signal {
	uint32_t signo;
};
int wire_exec_signal_encode(struct buf *b, const struct wire_exec_signal *m);
int wire_exec_signal_decode(struct buf *in, struct wire_exec_signal *m);

/* EXEC_RESIZE: u16 rows, u16 cols. */
struct wire_exec_resize {
	uint16_t rows, cols;
};
int wire_exec_resize_encode(struct buf *b, const struct wire_exec_resize *m);
int wire_exec_resize_decode(struct buf *in, struct wire_exec_resize *m);

/* EXEC_EXIT: code 0..255, signal 0..64 (encode: -EINVAL), flags
 * WIRE_EXEC_X_*, duration and output byte counts. */
struct wire_exec_exit {
	uint32_t code, signo;
	uint8_t flags;
	uint64_t duration_ms, stdout_bytes, stderr_bytes;
};
int wire_exec_exit_encode(struct buf *b, const struct wire_exec_exit *m);
int wire_exec_exit_decode(struct buf *in, struct wire_exec_exit *m);

/* EXEC_STDIN_ACK: u32 stdin bytes taken. */
struct wire_exec_stdin_ack {
	uint32_t bytes;
};
int wire_exec_stdin_ack_encode(struct buf *b, const struct wire_exec_stdin_ack *m);
int wire_exec_stdin_ack_decode(struct buf *in, struct wire_exec_stdin_ack *m);

/* PROXY_OPEN: u32 exec stream of the command the connection belongs to. */
struct wire_proxy_open {
	uint32_t exec_stream;
};
int wire_proxy_open_encode(struct buf *b, const struct wire_proxy_open *m);
int wire_proxy_open_decode(struct buf *in, struct wire_proxy_open *m);

/* PROXY_CLOSE: u8 code, <= WIRE_PROXY_C_MAX (encode: -EINVAL). */
struct wire_proxy_close {
	uint8_t code;
};
int wire_proxy_close_encode(struct buf *b, const struct wire_proxy_close *m);
int wire_proxy_close_decode(struct buf *in, struct wire_proxy_close *m);

#endif
