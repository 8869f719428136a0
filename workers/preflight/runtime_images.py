"""The runtime images of an `eks` cluster, shown to exist before a deployment is approved onto it: each image the
cluster registers (`runtime_images`, deployments.runtime_images) is in its ECR repository (`ecr:DescribeImages` by
digest, with the worker's identity), and the GPU node role may pull it (IAM's simulation of `ecr:BatchGetImage` and
`ecr:GetDownloadUrlForLayer` on the repository's ARN). A GPU runtime with no image registered fails: its deployments
are refused. Each line names its runtime as its subject (`runtime:<key>`), so an approval can be refused for the
runtimes whose image failed while the others go on.
"""
from dataclasses import replace

from botocore.exceptions import BotoCoreError, ClientError

from deployments.catalog import RUNTIMES
from deployments.check_subjects import runtime_subject
from deployments.runtime_images import REGISTER_FIX, pinned_image_parse
from workers.preflight.lines import FAIL, PASS, UNVERIFIED, CheckLine

CHECK, PULL_CHECK = "runtime-images", "runtime-image-pull"
# What a node's kubelet calls to pull a layer of an ECR image, on the repository (ECR's IAM reference); the
# registry-wide ecr:GetAuthorizationToken is node-role-iam's.
PULL_ACTIONS = ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer")


class RuntimeImageChecks:
    """Lines about the images of the GPU runtimes an `eks` cluster runs; `self.target` is its EksTarget, and the
    AWS clients and IAM simulation are AwsChecks'."""

    def runtime_images(self) -> list[CheckLine]:
        registered = self.target.config.runtime_images
        lines = []
        for key in sorted(k for k, r in RUNTIMES.items() if r.accelerator == "gpu" and "eks" in r.target_kinds):
            if ref := registered.get(key):
                lines += [replace(line, subject=runtime_subject(key)) for line in self._runtime_image(key, ref)]
            else:
                lines.append(CheckLine(CHECK, FAIL, f"No image is registered for runtime {key} (runtime_images): "
                                       "deployments of it are refused at request and approval.",
                                       f"{REGISTER_FIX.capitalize()}.", runtime_subject(key)))
        return lines

    def _runtime_image(self, key: str, ref: str) -> list[CheckLine]:
        image = pinned_image_parse(ref)  # checked when the config was written
        ecr = image.ecr if image else None
        if ecr is None:
            return [CheckLine(CHECK, UNVERIFIED, f"{ref} is not in a private ECR registry: Tandem cannot ask it "
                              "whether the image exists or may be pulled by the node role.",
                              "Push the image to the cluster's ECR registry and register that digest "
                              "(docs/install.md, step 5).")]
        account, region, repository = ecr["account"], ecr["region"], image.repository
        where = f"repository {repository} of ECR {account} ({region})"
        push = (f"Build and push it (docs/install.md, step 5), then register the digest ECR reports: tandemctl "
                f"cluster set {self.cluster.name} 'runtime_images={{\"{key}\": \"{image.registry}/{repository}"
                "@sha256:...\"}'.")
        try:
            found = self._aws_client("ecr").describe_images(registryId=account, repositoryName=repository,
                                                            imageIds=[{"imageDigest": image.digest}])
        except ClientError as e:
            error = e.response.get("Error", {})
            code, message = error.get("Code", ""), error.get("Message", "")
            if code == "RepositoryNotFoundException":
                return [CheckLine(CHECK, FAIL, f"ECR has no {where}: {message}",
                                  f"aws ecr create-repository --repository-name {repository} --region {region}; "
                                  f"{push}")]
            if code == "ImageNotFoundException":
                return [CheckLine(CHECK, FAIL, f"ECR has no image {image.digest} in {where}: every Ray pod of "
                                  f"runtime {key} would end in ErrImagePull. ECR: {message}", push)]
            return [CheckLine(CHECK, FAIL, f"AWS refused ecr:DescribeImages on {where}: {code}: {message}",
                              "Allow the worker's role ecr:DescribeImages on the repository "
                              "(deploy/iam/eks-driver-policy.json), then run the checks again.")]
        except BotoCoreError as e:
            return [CheckLine(CHECK, FAIL, f"AWS failed ecr:DescribeImages on {where}: {e}",
                              "Fix what the evidence names, then run the checks again.")]
        detail = (found.get("imageDetails") or [{}])[0]
        tags = ", ".join(detail.get("imageTags") or []) or "no tag"
        pushed = f", pushed {detail['imagePushedAt']:%Y-%m-%d}" if detail.get("imagePushedAt") else ""
        exists = CheckLine(CHECK, PASS, f"{ref} is in {where} ({tags}{pushed}).")
        partition = "aws-cn" if ecr["china"] else "aws"
        arn = f"arn:{partition}:ecr:{region}:{account}:repository/{repository}"
        pull = self._simulate(PULL_CHECK, self.target.config.node_role_arn, [(PULL_ACTIONS, [arn], ())],
                              fix=f"Give the node role ecr:BatchGetImage and ecr:GetDownloadUrlForLayer on {arn} "
                                  "(AmazonEC2ContainerRegistryReadOnly grants them), then run the checks again.")
        return [exists, pull]
