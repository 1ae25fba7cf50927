# Run by the chart's pre-delete hook Job <fullname>-uninstall-slices (templates/uninstall-hook.yaml)
# as `python3 -c <this file> <driver>`, in the agent's image, after the DaemonSet's pods stopped:
# delete every ResourceSlice whose spec.driver is <driver> (a node whose agent died leaves its
# slice behind), then list again: exit 0 when none is left, 1 with one line otherwise.
# Standard library and the image's kubernetes client only; JSON is read raw (no typed models).
import json
import os
import sys
import time

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

driver = sys.argv[1]
selector = "spec.driver=" + driver
if os.environ.get("KUBERNETES_SERVICE_HOST"):
    config.load_incluster_config()
else:  # outside a pod (tests): KUBECONFIG
    config.load_kube_config()
api = client.ResourceV1Api()


def names():
    resp = api.list_resource_slice(field_selector=selector, _preload_content=False)
    return sorted(item["metadata"]["name"] for item in json.loads(resp.data)["items"])


try:
    found = names()
    left = found
    for attempt in range(5):
        if not left:
            break
        if attempt:
            time.sleep(1)
        api.delete_collection_resource_slice(field_selector=selector, _preload_content=False)
        left = names()
except ApiException as exc:
    if exc.status == 404:  # the list itself: the API is not served
        print("resource.k8s.io/v1 is not served: no ResourceSlice to delete")
        sys.exit(0)
    print(
        f"deleting the ResourceSlices of {driver} ({selector}): HTTP {exc.status} {exc.reason}",
        file=sys.stderr,
    )
    sys.exit(1)
if left:
    print(f"ResourceSlices of {driver} still there: {', '.join(left)}", file=sys.stderr)
    sys.exit(1)
deleted = ", ".join(found) if found else "none was left"
print(f"ResourceSlices of {driver} deleted: {deleted}")
