#!/bin/sh
# A demo handler for `dlqctl work ... -- topology/demo-handler.sh`.
# The body arrives on stdin; DLQCTL_* variables describe the delivery.
#   body contains "bad"   -> exit 65: permanent failure, straight to the DLQ
#   body contains "down"  -> exit 1 every time: retried, then dead-lettered;
#                            with DEMO_SERVICE_UP=1 in the worker's
#                            environment (the service is back), success
#   anything else         -> fails on the first two attempts, then succeeds
body=$(cat)
case "$body" in
  *bad*)  echo "cannot parse message: $body" >&2; exit 65 ;;
  *down*)
    if [ -n "$DEMO_SERVICE_UP" ]; then
      echo "processed $DLQCTL_MESSAGE_ID: the payment service is back" >&2
      exit 0
    fi
    echo "payment service unavailable (attempt $DLQCTL_ATTEMPT of $DLQCTL_MAX_ATTEMPTS)" >&2; exit 1 ;;
esac
if [ "$DLQCTL_ATTEMPT" -lt 3 ]; then
  echo "upstream timeout (attempt $DLQCTL_ATTEMPT of $DLQCTL_MAX_ATTEMPTS)" >&2
  exit 75
fi
echo "processed $DLQCTL_MESSAGE_ID from $DLQCTL_EXCHANGE/$DLQCTL_ROUTING_KEY" >&2
exit 0
