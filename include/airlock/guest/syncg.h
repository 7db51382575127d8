/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_SYNCG_H
#define AIRLOCK_SYNCG_H

/*
 * syncg: the guest side of the sync protocol (wire.h "sync" group,
 * doc/PROTOCOL.md "Sync"), on top of apply.h.
 *
 * One struct syncg per agent: the workspace root (an apply handle), the
 * state directory that holds the last applied sequence number, and this
 * guest's static public key (for the batch scope). At most one session
 * syncs at a time; a second one gets EBUSY.
 *
 * The state directory is outside the root (the host would otherwise see
 * it as guest files), default "<root>.airlock-state"; the sequence file in
 * it ("sync-seq") is replaced atomically after every applied batch, so a
 * batch that was applied stays refused after an agent restart.
 *
 * Security: the channel already authenticates the host (its static key is
 * on the allow-list). A batch is additionally verified with the Ed25519
 * sync-signing key the host announced in HELLO and the scope
 * syncmsg_scope(guest key, that signing key): defence in depth, so a bug in
 * session routing, or a batch captured from another guest or workspace,
 * cannot be applied here.
 *
 * Errors are -errno with a message in err.
 */

#include <stddef.h>
#include <stdint.h>

#include "airlock/content/apply.h"
#include "airlock/core/buf.h"

struct chan;
struct syncg;
struct syncg_session;

#define SYNCG_STATE_SUFFIX ".airlock-state"
#define SYNCG_SEQ_FILE	   "sync-seq"
/* A session whose unsent replies exceed this is dropped (the host asks
 * for more than it reads). */
#define SYNCG_OUT_MAX (64u << 20)

/* Open the root (created by the caller) and the state directory
 * (state_dir NULL: root + SYNCG_STATE_SUFFIX; created mode 0700; must not
 * be inside the root), and load the persisted sequence. */
int syncg_open(const char *root, const char *state_dir, const struct apply_opts *opts, const uint8_t guest_pub[32],
	       struct syncg **out, char *err, size_t errlen);
void syncg_free(struct syncg *g); /* NULL is a no-op */
uint64_t syncg_last_seq(const struct syncg *g);
/* The generation of the copy (never 0), sent in SYNC_STATE: new when the
 * state has none or was written for another root (doc/SYNC.md
 * "Generations"). */
uint64_t syncg_generation(const struct syncg *g);
/* The tracker watching the copy (track.h; NULL: none), kept by the
 * caller, who reads its events before handing a frame to a session: a
 * BEGIN that finds no event since the last one's scan started answers
 * from that scan without walking (doc/SYNC.md "Unchanged trees"); each
 * batch applied is handed to track_applied_read / _path. */
struct track;
void syncg_set_track(struct syncg *g, struct track *t);
/* BEGINs that walked or scanned the copy (the others answered from a
 * quiet tracker): for tests and the bench. */
uint64_t syncg_walks(const struct syncg *g);
const char *syncg_state_dir(const struct syncg *g);
/* The chunk parameters of the last SYNC_BEGIN (chunk_params_default
 * before one): guest changes are hashed with them, as the host's
 * manifests are. */
const struct chunk_params *syncg_params(const struct syncg *g);

/* Verify one batch (signature with host_sign_pk, scope, sequence, hashes),
 * apply it, persist the new sequence. st may be NULL. */
int syncg_apply_batch(struct syncg *g, const uint8_t *bytes, size_t n, const uint8_t host_sign_pk[32],
		      struct apply_stats *st, char *err, size_t errlen);

/* Per-session state, made on the first sync frame of a session. */
int syncg_session_new(struct syncg *g, struct chan *c, const uint8_t host_sign_pk[32], struct syncg_session **out);
void syncg_session_free(struct syncg_session *ss); /* releases the sync lock; NULL is a no-op */

/* One sync frame from the host. 0, or -errno when the session must be
 * dropped (err says why). Replies are queued and sent as the window
 * allows; call syncg_session_writable from on_writable. */
int syncg_session_frame(struct syncg_session *ss, uint8_t type, uint32_t stream, const uint8_t *p, size_t n, char *err,
			size_t errlen);
int syncg_session_writable(struct syncg_session *ss);

#endif
