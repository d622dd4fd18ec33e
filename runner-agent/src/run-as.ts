/** The unprivileged user runtimes and setup scripts run as (`svc-runner --run-as`). */
export interface RunAs {
  name: string;
  uid: number;
  gid: number;
}
