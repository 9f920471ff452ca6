-- Argo CD health for Tessera's kinds (GpuPartitionPlan, TenantGpuQuota, GpuNode).
-- Mirrors kstatus: stale observedGeneration or Reconciling -> Progressing; Stalled -> Degraded;
-- Ready -> Healthy; a paused plan that is not Ready -> Suspended.
local hs = { status = "Progressing", message = "Waiting for Tessera to report status" }
if obj.status == nil then
  return hs
end
local function condition(t)
  for _, c in ipairs(obj.status.conditions or {}) do
    if c.type == t then
      return c
    end
  end
  return nil
end
-- A Stalled condition about the current spec wins (a GpuNode's observedGeneration is the generation
-- its agent has applied, so it lags exactly while the agent is stuck).
local stalled = condition("Stalled")
if stalled ~= nil and stalled.status == "True" and
    (stalled.observedGeneration == nil or stalled.observedGeneration == obj.metadata.generation) then
  hs.status = "Degraded"
  hs.message = stalled.reason .. ": " .. stalled.message
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= obj.metadata.generation then
  local working = condition("Reconciling")
  if working ~= nil and working.status == "True" and working.observedGeneration == obj.metadata.generation then
    hs.message = working.message
  else
    hs.message = "Waiting for the latest spec (generation " .. tostring(obj.metadata.generation) .. ") to be observed"
  end
  return hs
end
local ready = condition("Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message
  local capacity = condition("CapacityAvailable")
  if capacity ~= nil and capacity.status == "False" then
    hs.message = capacity.message
  end
  return hs
end
if obj.kind == "GpuPartitionPlan" and obj.spec ~= nil and obj.spec.paused then
  hs.status = "Suspended"
  hs.message = "Paused"
  return hs
end
local reconciling = condition("Reconciling")
if reconciling ~= nil and reconciling.status == "True" then
  hs.message = reconciling.message
elseif ready ~= nil then
  hs.message = ready.message
end
return hs
