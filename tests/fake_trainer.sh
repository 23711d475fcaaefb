# Plays `python -m bertjax.main` on a fake TPU worker of tests/fake_gcloud.py: records its
# arguments, logs two steps, and behaves as the scenario says.
# Kept outside the worker's $HOME, which a deleted slice takes with it.
printf '%s\0' "$@" > "$FAKE_GCLOUD_DIR/trainer-argv-$FAKE_WORKER_ID"
echo started >> "$FAKE_GCLOUD_DIR/trainer-starts-$FAKE_WORKER_ID"
# bertjax.main saves on SIGTERM and exits 75: run the same command again to resume.
trap 'kill $! 2>/dev/null; echo "SIGTERM: checkpoint saved"; exit 75' TERM
echo "worker $FAKE_WORKER_ID: step 1"
if [ "$FAKE_GCLOUD_SCENARIO" = maintenance ] && \
        [ "$(wc -l < "$FAKE_GCLOUD_DIR/trainer-starts-$FAKE_WORKER_ID")" = 1 ]; then
    echo "stopped by a signal: saved step 1"  # a maintenance event's SIGTERM, on every worker
    exit 75
fi
if [ "$FAKE_GCLOUD_SCENARIO" = fail ]; then
    if [ "$FAKE_WORKER_ID" = 1 ]; then
        echo "ValueError: worker 1 read a bad shard"
        exit 3
    fi
    # The others wait for worker 1 in a collective until they are stopped.
    sleep 60 & wait $!
fi
# A test that must act while the run goes on holds it until it creates the release file.
if [ -n "$FAKE_TRAINER_HOLD" ]; then
    while [ ! -e "$FAKE_GCLOUD_DIR/release" ]; do sleep 0.1 & wait $!; done
fi
sleep 1.5 & wait $!
echo "worker $FAKE_WORKER_ID: step 2, done"
