"""The Redis flag that says a team is over its monthly budget, the gateway's cheap copy of the budget rule.

deployments.services.budgets sets and clears it from `BudgetState.over` (the one rule); the gateway reads it only
before it wakes a paused deployment (gateway.wake), so a request does not promise a wake the worker will refuse.
"""
OVER_BUDGET_KEY = "tandem:budget:over:{}"  # the team's id
