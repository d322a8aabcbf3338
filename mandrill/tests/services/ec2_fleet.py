"""Sets EC2 fleets up on moto and looks at them from outside, with boto3.

ec2_fleet.py ENDPOINT COMMAND ARGS... prints one JSON value:
  run ZONE COUNT KEY=VALUE...     launch instances with tags: their ids
  group NAME ZONE DESIRED         an auto scaling group: its instance ids
  describe-group NAME             desired capacity, instances in service
  user NAME ACTION...             an IAM user allowed ACTIONs only: its keys
  state ID                        the instance's state and tags
  wait ID STATE SECONDS           wait until the instance is in STATE
  stop ID KEY=VALUE...            tag the instance, stop it (as its operator
                                  would), wait until it is stopped: its state
  watch ID SECONDS                {"watching": STATE} at once, then the
                                  instance's states, polled every 0.1s
                                  until it was seen stopped then running:
                                  how long it was seen stopped
"""

import json
import os
import sys
import time

import boto3

endpoint, command, args = sys.argv[1], sys.argv[2], sys.argv[3:]
session = dict(region_name=os.environ["AWS_REGION"], endpoint_url=endpoint)
ec2 = boto3.client("ec2", **session)
autoscaling = boto3.client("autoscaling", **session)


def image():
    return ec2.describe_images()["Images"][0]["ImageId"]


def instance(instance_id):
    reservations = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    found = reservations[0]["Instances"][0]
    tags = {tag["Key"]: tag["Value"] for tag in found.get("Tags", [])}
    return {"state": found["State"]["Name"], "tags": tags}


if command == "run":
    zone, count, tags = args[0], int(args[1]), [a.split("=", 1) for a in args[2:]]
    launched = ec2.run_instances(
        ImageId=image(),
        MinCount=count,
        MaxCount=count,
        InstanceType="t3.micro",
        Placement={"AvailabilityZone": zone},
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags]}
        ],
    )
    print(json.dumps([i["InstanceId"] for i in launched["Instances"]]))
elif command == "group":
    name, zone, desired = args[0], args[1], int(args[2])
    ec2.create_launch_template(
        LaunchTemplateName=name + "-template",
        LaunchTemplateData={"ImageId": image(), "InstanceType": "t3.micro"},
    )
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateName": name + "-template"},
        MinSize=desired,
        MaxSize=desired + 1,
        DesiredCapacity=desired,
        AvailabilityZones=[zone],
        Tags=[{"Key": "chaos", "Value": "yes", "PropagateAtLaunch": True}],
    )
    group = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])
    print(json.dumps([i["InstanceId"] for i in group["AutoScalingGroups"][0]["Instances"]]))
elif command == "describe-group":
    group = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[args[0]])
    group = group["AutoScalingGroups"][0]
    in_service = [
        i["InstanceId"] for i in group["Instances"] if i["LifecycleState"] == "InService"
    ]
    print(json.dumps({"desired": group["DesiredCapacity"], "in_service": in_service}))
elif command == "user":
    iam = boto3.client("iam", **session)
    iam.create_user(UserName=args[0])
    key = iam.create_access_key(UserName=args[0])["AccessKey"]
    policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": args[1:], "Resource": "*"}],
    }
    iam.put_user_policy(UserName=args[0], PolicyName="chaos", PolicyDocument=json.dumps(policy))
    print(json.dumps({"id": key["AccessKeyId"], "secret": key["SecretAccessKey"]}))
elif command == "state":
    print(json.dumps(instance(args[0])))
elif command == "wait":
    instance_id, wanted, deadline = args[0], args[1], time.time() + float(args[2])
    while instance(instance_id)["state"] != wanted:
        if time.time() > deadline:
            sys.exit(f"{instance_id} was not {wanted} within {args[2]}s")
        time.sleep(0.1)
    print(json.dumps(instance(instance_id)))
elif command == "stop":
    tags = [a.split("=", 1) for a in args[1:]]
    if tags:
        ec2.create_tags(Resources=[args[0]], Tags=[{"Key": k, "Value": v} for k, v in tags])
    ec2.stop_instances(InstanceIds=[args[0]])
    while instance(args[0])["state"] != "stopped":
        time.sleep(0.1)
    print(json.dumps(instance(args[0])))
elif command == "watch":
    instance_id, deadline = args[0], time.time() + float(args[1])
    stopped_at = None
    print(json.dumps({"watching": instance(instance_id)["state"]}), flush=True)
    while time.time() < deadline:
        state = instance(instance_id)["state"]
        now = time.time()
        if state == "stopped" and stopped_at is None:
            stopped_at = now
        if state == "running" and stopped_at is not None:
            print(json.dumps({"seen_stopped_for": now - stopped_at}))
            sys.exit(0)
        time.sleep(0.1)
    sys.exit(f"{instance_id} was not seen stopped then running within {args[1]}s")
else:
    sys.exit(f"unknown command {command}")
