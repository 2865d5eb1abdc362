source <(sed -n '/^on_device_env() {/,/^}/p' scripts/gpu-check); on_device_env
for c in "write 64KiB 64" "read 64KiB 64" "write 1MiB 16" "read 1MiB 16"; do set -- $c
 for t in off on; do rm -f /tmp/tr.*; echo "== $c, trace $t"
  if [ $t = on ]; then export FERRY_TRACE_FILE=/tmp/tr; else unset FERRY_TRACE_FILE; fi
  $FERRY_BIN bench transfer --transport tcp --op $1 --block-size $2 --batch-size $3 --duration 2 | sed -n '2p;4p'
 done; unset FERRY_TRACE_FILE; python3 scripts/trace-batches /tmp/tr; done
rm -f /tmp/tr.*; echo "== GPU write 1MiB 16"
FERRY_TRACE_FILE=/tmp/tr $FERRY_BIN bench transfer --transport tcp --op write --block-size 1MiB --batch-size 16 --duration 2 --gpu-src 0 --gpu-dst 0 | sed -n '2p;4p'
python3 scripts/trace-batches /tmp/tr
