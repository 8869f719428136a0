// A real OpenID provider (node-oidc-provider) for Tandem's sign-in tests.
//
//   node provider.js PORT ACCOUNTS_JSON CLIENT_ID CLIENT_SECRET REDIRECT_URI
//
// Accounts (id → {email, email_verified, name, groups}) are read from ACCOUNTS_JSON on every claim lookup, so a
// test changes a user's claims between two sign-ins by rewriting the file. Sign-in uses the provider's own
// development interactions: a login form that accepts any password for a known account id, then a consent page.
// An account removed from the file is signed out here, as a provider does when a person is disabled: a silent
// re-check (prompt=none) is answered `login_required`.
import { readFileSync } from 'node:fs';

import Provider, { interactionPolicy } from 'oidc-provider';

const [port, accountsFile, clientId, clientSecret, redirectUri] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;

function accounts() {
  return JSON.parse(readFileSync(accountsFile, 'utf8'));
}

const policy = interactionPolicy.base();
policy.get('login').checks.add(new interactionPolicy.Check(
  'account_removed', 'The account was removed', 'login_required',
  (ctx) => Boolean(ctx.oidc.session.accountId) && !accounts()[ctx.oidc.session.accountId],
));

const provider = new Provider(issuer, {
  interactions: { policy },
  clients: [{
    client_id: clientId,
    client_secret: clientSecret,
    redirect_uris: [redirectUri],
    post_logout_redirect_uris: [new URL('/accounts/login/', redirectUri).href],
    response_types: ['code'],
    grant_types: ['authorization_code'],
    token_endpoint_auth_method: 'client_secret_basic',
    id_token_signed_response_alg: 'RS256',
  }],
  scopes: ['openid', 'email', 'profile', 'groups'],
  claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['name'], groups: ['groups'] },
  pkce: { required: () => true },
  cookies: { keys: ['tandem-test-oidc-cookie-key'] },
  async findAccount(ctx, id) {
    const account = accounts()[id];
    if (!account) return undefined;
    return {
      accountId: id,
      async claims() {
        const now = accounts()[id] || account;
        return {
          sub: id, email: now.email, email_verified: now.email_verified ?? true, name: now.name,
          groups: now.groups || [],
        };
      },
    };
  },
});
provider.proxy = false;
provider.listen(Number(port), '127.0.0.1', () => {
  console.log(`oidc-provider listening on ${issuer}`);
});
