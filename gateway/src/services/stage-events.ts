import type { outbox } from '@svc/db';

/**
 * A stage event the service writes itself (into the outbox, with the change it reports): of
 * the turn `turnId`, or of none (null) when it is about the conversation's sandbox.
 */
export function stageEvent(
  conversationId: string,
  turnId: string | null,
  stage: string,
  state: string,
  data?: string,
): outbox.OutboxEvent {
  return {
    conversationId,
    turnId,
    kind: 'stage',
    stream: 'stage',
    stage,
    state,
    ...(data === undefined ? {} : { data }),
  };
}
