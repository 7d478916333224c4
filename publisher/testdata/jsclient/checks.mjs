// What every script here does on a mismatch: say what differed on stderr,
// prefixed with the script's name, and exit 1, which fails the Go test that
// ran it. describe shows an SDK's error (apiError: its APIError class) with
// its status and API-shaped body, which a plain message would not.

export function checks(script, apiError) {
  const fail = (msg) => {
    console.error(`${script}: ${msg}`);
    process.exit(1);
  };
  const check = (ok, msg) => {
    if (!ok) fail(msg);
  };
  const describe = (err) =>
    err instanceof apiError ? `${err.constructor.name} ${err.status}: ${JSON.stringify(err.error)}` : String(err?.stack ?? err);
  return { fail, check, describe };
}
