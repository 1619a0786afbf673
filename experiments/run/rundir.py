"""The run directory, shared by the single-process and Launchpad layouts.

What both layouts write and read (docs/metrics.md), one module a job:

  * ``experiments.run.log_files``: flags.txt, metrics.jsonl, scores.jsonl,
    eval/scores.jsonl, tensorboard/, report.png, and the JSON helpers;
  * ``experiments.run.checkpoints``: checkpoints/ckpt-*/ and the Reverb
    checkpoints they reference (atomic writes, rotation, hard links);
  * ``experiments.run.resume``: the checks before a run writes anything, and
    the cut-back of the log files to the resumed checkpoint;
  * ``experiments.run.run_state``: run_state.json, one schema in both layouts.

restarts.jsonl (one row per node restart of a Launchpad run) is written by
``experiments.run.restarts``. This module is the one name callers import the
run directory by; it holds no code of its own.
"""

from experiments.run.checkpoints import (  # noqa: F401
    CKPT_PREFIX, CONFIG_FILE, KEPT_DIR, LEARNER_FILE, OLD_LEARNER_FILE,
    REPLAY_STATE_FILE, RESUME_FIXED, REVERB_DIR, TMP_PREFIX, CheckpointError,
    check_finite_state, checkpoint_reverb, checkpoint_root, clean_checkpoints,
    keep_reverb_checkpoint, latest_run_checkpoint, learner_state_template,
    list_run_checkpoints, load_learner_state, read_learner_state,
    read_saved_config, restore_learner, reverb_dir, sampler_state,
    write_checkpoint)
from experiments.run.log_files import (  # noqa: F401
    EVAL_DIR, FAULT_ENV, FLAGS_FILE, LOG_FILES, METRICS_FILE, REPORT_FILE,
    SCORES_FILE, TB_DIR, append_score, atomic_write, cut_file, file_sizes,
    json_default, jsonable, normalize_task, read_json, tail_lines)
from experiments.run.resume import (  # noqa: F401
    check_checkpoint_files, check_logdir_writable, check_mode,
    check_resume_compatible, load_resume_state, start_segment, validate)
from experiments.run.run_state import (  # noqa: F401
    ACTOR_KEYS, LEARNER_KEYS, MODES, ONE_PROCESS_LEARNER_KEYS, RUN_STATE_FILE,
    RUN_STATE_SCHEMA, load_run_state, make_run_state)
