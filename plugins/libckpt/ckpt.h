/* libckpt: ask for a checkpoint from inside a program running under `ckpt launch`, and run code
 * around checkpoints. Every function is harmless when the program runs without ckpt.
 *
 * Link with -lckpt (libckpt.so or libckpt.a, built by `make -C plugins/libckpt`).
 */
#ifndef CKPT_H
#define CKPT_H

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the program runs under ckpt (its checkpoint directory is known and its agent
 * answers), 0 otherwise. */
int ckpt_is_enabled(void);

/* Takes a checkpoint of the whole job now and waits until it is committed.
 * Returns 0 when the program goes on after the checkpoint, 1 when it was restarted from it, and
 * -1 with errno set on failure (ENOSYS: not running under ckpt; EIO: the checkpoint failed). */
int ckpt_checkpoint(void);

/* Functions run around every checkpoint this process asks for: `before` just before it,
 * `after_resume` when the program goes on after it, `after_restart` when the program was
 * restarted from it. Any of them may be NULL. Returns 0. */
typedef void (*ckpt_hook)(void *arg);
int ckpt_register_hooks(ckpt_hook before, ckpt_hook after_resume, ckpt_hook after_restart, void *arg);

#ifdef __cplusplus
}
#endif

#endif
